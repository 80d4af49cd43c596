"""The compute processes on a GPU (or MIG instance) in a window, through the NVML doorway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelfleet.errors import Unsupported
from kernelfleet.telemetry.nvml_api import Nvml, NvmlCallFailed
from kernelfleet.telemetry.sample import ProcessSample


def running_processes(nvml: Nvml, handle: Any, since_microseconds: int, proc_root: Path,
                      names: dict[int, str | None] | None = None) -> tuple[ProcessSample, ...]:
    """PID, name (from ``proc_root``), memory and, on a shared GPU, SM share of each process on ``handle``.

    ``names`` (pid -> name) is kept by the caller between windows: a process still listed keeps
    the name read when it first appeared (a PID is not reused while its process lives), so a
    long job costs no /proc read a window; it is left with only the PIDs listed now.
    """
    running = nvml.optional("nvmlDeviceGetComputeRunningProcesses", handle) or []
    sm_by_pid: dict[int, float] = {}
    # Per-process SM use only matters to split a shared GPU, and costs ~2.4 ms of CPU
    # per call on an H200 (bench/nvml_calls.py), so it is read only when shared.
    if len(running) > 1:
        try:
            for entry in nvml.call("nvmlDeviceGetProcessUtilization", handle, since_microseconds):
                sm_by_pid[entry.pid] = entry.smUtil / 100.0
        except (NvmlCallFailed, Unsupported):
            pass  # NOT_FOUND when no process ran in the window; the list stays empty
    known = names if names is not None else {}
    listed = {p.pid: known[p.pid] if p.pid in known else _process_name(proc_root, p.pid) for p in running}
    if names is not None:
        names.clear()
        names.update(listed)
    return tuple(
        ProcessSample(
            pid=p.pid,
            name=listed[p.pid],
            used_memory_bytes=p.usedGpuMemory,
            sm_active_ratio=sm_by_pid.get(p.pid),
        )
        for p in running
    )


def _process_name(proc_root: Path, pid: int) -> str | None:
    try:
        return (proc_root / str(pid) / "comm").read_text().strip() or None
    except OSError:
        return None  # another PID namespace, or the process has exited
