"""The plain records every counter source yields.

A :class:`Sample` describes one GPU (or one MIG instance) over one window. A
value the hardware could not give is ``None``, never 0: a GPU without GPM has
``tensor_active_ratio=None``, and a stale sample (NVML failed while reading it)
has every counter ``None`` and ``stale=True``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import UsageError


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process holding a GPU during a window."""

    pid: int
    name: str | None = None
    used_memory_bytes: int | None = None
    sm_active_ratio: float | None = None  # per-process SM utilisation, when NVML gives it


@dataclass(frozen=True, slots=True)
class Sample:
    """One GPU (or MIG instance) over one window ending at ``timestamp_seconds``."""

    timestamp_seconds: float  # Unix time at the end of the window
    window_seconds: float
    gpu_index: int
    uuid: str
    name: str  # as NVML reports it, e.g. "NVIDIA H200"
    pci_device_id: int | None = None
    mig_instance: int | None = None  # GPU instance id when this is a MIG slice
    gpm_supported: bool = True
    stale: bool = False
    error: str | None = None
    # GPM metrics over the window, as ratios in [0, 1]
    tensor_active_ratio: float | None = None
    hmma_active_ratio: float | None = None
    imma_active_ratio: float | None = None
    dfma_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    dram_bandwidth_ratio: float | None = None
    fp16_active_ratio: float | None = None
    fp32_active_ratio: float | None = None
    fp64_active_ratio: float | None = None
    integer_active_ratio: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    # GPM cycle counters as NVML reports them, where the driver has them (see telemetry/nvml.py)
    sm_cycles_elapsed_raw: float | None = None
    mma_cycles_active_raw: float | None = None
    # SM clock: time-weighted mean of dense polls over exactly this window, the
    # last single read (what a once-per-window sampler would see), and the count.
    sm_clock_mean_hertz: float | None = None
    sm_clock_instant_hertz: float | None = None
    sm_clock_polls: int = 0
    sm_clock_max_hertz: float | None = None
    power_mean_watts: float | None = None
    memory_used_bytes: int | None = None
    # Device health (telemetry/health.py); recordings made before these existed read them as None.
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    clock_event_reasons_bitmask: int | None = None  # NVML's nvmlClocksEventReason* bits at the window's end
    xid_errors_total: int | None = None  # Xid events seen since the source opened
    xid_last: int | None = None  # the code of the latest of them
    ecc_corrected_errors_total: int | None = None  # volatile counts: since the driver loaded
    ecc_uncorrected_errors_total: int | None = None
    processes: tuple[ProcessSample, ...] = field(default_factory=tuple)

    def gone_stale(self, error: str) -> Sample:
        """This GPU's identity and window, with every counter gone: what a GPU that stopped
        reporting shows (a stale sample has no values, so nothing reads it as current)."""
        return Sample(timestamp_seconds=self.timestamp_seconds, window_seconds=self.window_seconds,
                      gpu_index=self.gpu_index, uuid=self.uuid, name=self.name, pci_device_id=self.pci_device_id,
                      mig_instance=self.mig_instance, gpm_supported=self.gpm_supported, stale=True, error=error)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; ``Sample.from_dict`` reads it back exactly."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["processes"] = [dataclasses.asdict(p) for p in self.processes]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Sample:
        """Build a Sample from ``to_dict`` output; ``UsageError`` names the bad field."""
        if not isinstance(data, dict):
            raise UsageError(f"expected a sample object, got {type(data).__name__}")
        values = _typed_fields(cls, {k: v for k, v in data.items() if k != "processes"})
        processes = data.get("processes", [])
        if not isinstance(processes, list):
            raise UsageError("field 'processes': expected a list")
        values["processes"] = tuple(
            ProcessSample(**_typed_fields(ProcessSample, p if isinstance(p, dict) else {"pid": p}))
            for p in processes
        )
        return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}


def _typed_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Check ``data`` against ``cls``'s annotations; unknown keys are an error."""
    hints = _HINTS.setdefault(cls, typing.get_type_hints(cls))
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise UsageError(f"unknown field(s) {sorted(unknown)} in {cls.__name__}")
    out: dict[str, Any] = {}
    for name, value in data.items():
        allowed = _allowed_types(hints[name])
        if value is None and type(None) in allowed:
            out[name] = None
        elif isinstance(value, bool) and bool not in allowed:
            raise UsageError(f"field {name!r}: expected a number, got {value!r}")
        elif float in allowed and isinstance(value, int | float):
            if not math.isfinite(value) or value < 0:  # JSON's NaN and Infinity; no field of ours is negative
                raise UsageError(f"field {name!r}: expected a finite number >= 0, got {value!r}")
            out[name] = float(value)
        elif any(isinstance(value, t) for t in allowed if t is not type(None)):
            out[name] = value
        else:
            raise UsageError(f"field {name!r}: expected {hints[name]}, got {value!r}")
    missing = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    } - set(out)
    if missing:
        raise UsageError(f"missing field(s) {sorted(missing)} in {cls.__name__}")
    return out


def _allowed_types(hint: Any) -> tuple[type, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for t in typing.get_args(hint))
    return (typing.get_origin(hint) or hint,)
