"""What NvmlSource keeps of each thing it samples: a whole GPU, or one MIG instance of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelfleet.telemetry.nvml_hot import Read
from kernelfleet.telemetry.process_watch import ProcessWatch


@dataclass
class Target:
    """One thing GPM samples: a whole GPU, or one MIG instance of it."""

    gpu_index: int
    handle: Any  # the parent GPU's handle (GPM of a MIG slice is read through it)
    info_handle: Any  # the handle processes are read from (the MIG handle for a slice)
    uuid: str
    name: str
    pci_device_id: int | None
    max_clock_hertz: float | None
    mig_instance: int | None = None
    gpm_supported: bool = True
    previous: Any = None  # last GPM sample buffer
    spare: Any = None  # the buffer before it, reused for the next sample (no alloc/free per window)
    previous_time: float = 0.0
    previous_wall: float = 0.0
    previous_process_timestamp: int = 0
    failed: str | None = None  # set when a read failed: the next window starts fresh
    memory: Read | None = None  # bound once per NVML session (telemetry/nvml_hot.py)
    power: Read | None = None  # whole GPUs only: MIG slices have no power of their own
    processes: ProcessWatch | None = None  # listed when something says they changed (process_watch.py)


def identity(target: Target) -> dict[str, Any]:
    """The Sample fields that name the GPU, the same in every window."""
    return {
        "gpu_index": target.gpu_index,
        "uuid": target.uuid,
        "name": target.name,
        "pci_device_id": target.pci_device_id,
        "mig_instance": target.mig_instance,
        "gpm_supported": target.gpm_supported,
        "sm_clock_max_hertz": target.max_clock_hertz,
    }

