"""The compute processes on a GPU (or MIG instance) in a window, through the NVML doorway."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from kernelfleet.errors import Unsupported
from kernelfleet.telemetry.nvml_api import Nvml, NvmlCallFailed
from kernelfleet.telemetry.sample import ProcessSample

PROCESSES_CALL = "nvmlDeviceGetComputeRunningProcesses_v3"
PROCESS_SLOTS = 64  # more processes than this on one GPU take pynvml's sized call
NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE (unsigned long long): memory NVML cannot tell


class Listed(NamedTuple):
    """A process as NVML lists it (pynvml's object has the same two fields)."""

    pid: int
    usedGpuMemory: int | None  # NVML's name, as pynvml's object spells it


def process_lister(nvml: Nvml, handle: Any, direct: bool = True) -> Callable[[], list[Any]]:
    """The processes on ``handle``, read every window: [] where the GPU cannot list them.

    pynvml's wrapper makes two C calls a window (one for the count, one for the list) and turns
    each process into a dict-backed object; bound once to the C function with room for
    :data:`PROCESS_SLOTS` processes, it is one call (telemetry/nvml_hot.py says why that matters).
    """
    fn = nvml.function_pointer(PROCESSES_CALL) if direct else None
    if fn is None:
        return lambda: nvml.optional("nvmlDeviceGetComputeRunningProcesses", handle) or []
    infos = (nvml.m.c_nvmlProcessInfo_v3_t * PROCESS_SLOTS)()
    count = ctypes.c_uint()
    insufficient = getattr(nvml.m, "NVML_ERROR_INSUFFICIENT_SIZE", 7)
    args = (handle, ctypes.byref(count), infos)

    def listed() -> list[Any]:
        count.value = PROCESS_SLOTS
        status = fn(*args)
        if status == insufficient:
            return nvml.optional("nvmlDeviceGetComputeRunningProcesses", handle) or []
        if status:
            error = nvml.error(PROCESSES_CALL, status)
            if isinstance(error, Unsupported):
                return []
            raise error
        return [Listed(info.pid, None if info.usedGpuMemory == NOT_AVAILABLE else info.usedGpuMemory)
                for info in infos[:count.value]]

    return listed


def running_processes(nvml: Nvml, handle: Any, since_microseconds: int, proc_root: Path,
                      names: dict[int, str | None] | None = None,
                      lister: Callable[[], list[Any]] | None = None) -> tuple[ProcessSample, ...]:
    """PID, name (from ``proc_root``), memory and, on a shared GPU, SM share of each process on ``handle``.

    ``names`` (pid -> name) is kept by the caller between windows: a process still listed keeps
    the name read when it first appeared (a PID is not reused while its process lives), so a
    long job costs no /proc read a window; it is left with only the PIDs listed now. ``lister`` is
    the source's bound list (:func:`process_lister`); without it, pynvml's wrapper.
    """
    running = lister() if lister is not None else nvml.optional("nvmlDeviceGetComputeRunningProcesses", handle) or []
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
