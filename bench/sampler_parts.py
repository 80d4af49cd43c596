"""Where a sampler window's CPU goes on a GPU: each part of a window's reads timed warm (back to
back) and cold (right after a 100-ms sleep, as the sampler's loop runs it, less the sleep alone).

After a sleep, caches and branch predictors are cold and a read costs many times its warm cost
(docs/telemetry.md), so the cold column is what a window pays. bench/sampler_cost.py prints it
idle and under load; ``cold_us`` and ``warm_us`` are shared with its CPU-twin parts. Alone, on
whatever the GPUs run now:

    python -m bench.sampler_parts [--wakes 8]
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import Parser, command_line
from kernelfleet.errors import KernelfleetError
from kernelfleet.telemetry.gpm import GpmMetrics
from kernelfleet.telemetry.health import XID_EVENT, HealthReader
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.nvml_hot import bind, clock_reader
from kernelfleet.telemetry.process_watch import ProcessWatch
from kernelfleet.telemetry.processes import process_lister, running_processes

SLEEP_SECONDS = 0.1  # the poll period the parts are woken at


def warm_us(fn: Callable[[], Any], reps: int) -> float:
    """CPU µs of ``fn`` called back to back (after a warm-up)."""
    for _ in range(min(reps, 200)):
        fn()
    c0 = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - c0) / reps * 1e6


def cold_us(fn: Callable[[], Any], wakes: int, sleep: Callable[[float], Any] = time.sleep) -> float:
    """CPU µs of a wake-up from a 100-ms ``sleep`` and ``fn`` after it, as the poll loop runs it."""
    c0 = time.thread_time()
    for _ in range(wakes):
        sleep(SLEEP_SECONDS)
        fn()
    return (time.thread_time() - c0) / wakes * 1e6


def gpm_pair(nvml: Nvml, handle: Any, seconds: float = 0.2) -> tuple[Any, Any]:
    """Two GPM samples of the GPU ``seconds`` apart (free both with nvmlGpmSampleFree)."""
    first, second = nvml.call("nvmlGpmSampleAlloc"), nvml.call("nvmlGpmSampleAlloc")
    nvml.call("nvmlGpmSampleGet", handle, first)
    time.sleep(seconds)
    nvml.call("nvmlGpmSampleGet", handle, second)
    return first, second


def gpu_parts(nvml: Nvml, wakes: int = 8, reps: int = 200) -> list[dict[str, Any]]:
    """(part, warm µs, cold µs less a wake-up) of GPU 0's window reads, on an initialised ``nvml``."""
    m = nvml.m
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    first, second = gpm_pair(nvml, handle)
    quiet = GpmMetrics(nvml, lambda *_: None, cycle_counters=False)
    hooked = GpmMetrics(nvml, lambda *_: None, cycle_counters=False, layout=lambda struct: struct)
    health = HealthReader(nvml, lambda *_: None)
    health.watch({"gpu0": handle})
    memory = bind(nvml, "nvmlDeviceGetMemoryInfo", (handle,), m.c_nvmlMemory_t)
    power = bind(nvml, "nvmlDeviceGetPowerUsage", (handle,), ctypes.c_uint)
    names: dict[int, str | None] = {}
    lister = process_lister(nvml, handle)
    since = int((time.time() - 1) * 1e6)
    watch = ProcessWatch(nvml, handle, lister, Path("/proc"))
    used, listed_at = int(memory().used), time.monotonic()
    for _ in range(2):
        watch.read(used, listed_at, since)  # listed, then settled: later reads keep the list (never aged)
    empty = nvml.call("nvmlEventSetCreate")  # Xid events only: a 100-ms wait in it times out
    try:
        nvml.call("nvmlDeviceRegisterEvents", handle, XID_EVENT, empty)
    except KernelfleetError:
        pass  # an empty set waits all the same
    wait = bind(nvml, "nvmlEventSetWait_v2", (empty,), m.c_nvmlEventData_t,
                quiet=getattr(m, "NVML_ERROR_TIMEOUT", 10))
    parts: dict[str, Callable[[], Any]] = {
        "SM clock read (bound)": clock_reader(nvml, handle),
        "nvmlGpmSampleGet": lambda: nvml.call("nvmlGpmSampleGet", handle, second),
        "nvmlGpmMetricsGet, 15 metrics": lambda: quiet.metrics(first, second),
        "the same through pynvml's structure (session 11)": lambda: hooked.metrics(first, second),
        "processes (pynvml's wrapper: two C calls)": lambda: running_processes(nvml, handle, since, Path("/proc"),
                                                                               names),
        "processes (bound: one C call)": lambda: running_processes(nvml, handle, since, Path("/proc"), names, lister),
        "processes kept (used memory unchanged, one process or none)": lambda: watch.read(used, listed_at, since),
        "memory + power (bound)": lambda: (memory(), power()),
        "health: reasons, Xid drain": lambda: health.read("gpu0", handle),
    }
    rows = [{"part": "a 100-ms sleep alone (the wake-up)", "warm_us": None,
             "cold_us": cold_us(lambda: None, wakes)}]
    wake = rows[0]["cold_us"]
    try:
        for name, fn in parts.items():
            rows.append({"part": name, "warm_us": warm_us(fn, reps), "cold_us": cold_us(fn, wakes) - wake})
        rows.append({"part": "an NVML event wait of 100 ms instead of the sleep (the wake-up)", "warm_us": None,
                     "cold_us": cold_us(lambda: None, wakes, lambda s: wait(int(s * 1000)))})
    finally:
        health.close()
        for buffer in (first, second):
            nvml.call("nvmlGpmSampleFree", buffer)
        nvml.call("nvmlEventSetFree", empty)
    return rows


def window_parts(wakes: int = 8, reps: int = 100) -> list[dict[str, Any]]:
    """A whole window of every GPU (``NvmlSource.read``), warm and cold, on the default path and on
    session 11's (the process list every window)."""
    rows = []
    for label, options in (("", {}), (", the process list every window (session 11)",
                                       {"process_list_max_age_seconds": 0.0})):
        with NvmlSource(clock_mode="poll", **options) as source:
            wake = cold_us(lambda: None, wakes)
            rows.append({"part": f"a whole window, every GPU (NvmlSource.read){label}",
                         "warm_us": warm_us(source.read, reps), "cold_us": cold_us(source.read, wakes) - wake})
    return rows


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wakes", type=int, default=8, help="wake-ups each part is timed over, cold")
    args = parser.parse_args()
    print(f"command: {command_line()}")
    nvml = Nvml()
    nvml.init()
    try:
        rows = gpu_parts(nvml, args.wakes)
    finally:
        nvml.shutdown()
    rows.extend(window_parts(args.wakes))
    print(f"{'part of a window (GPU 0)':>84} {'warm µs':>8} {'cold µs':>8}")
    for r in rows:
        warm = "-" if r["warm_us"] is None else f"{r['warm_us']:.1f}"
        print(f"{r['part']:>84} {warm:>8} {r['cold_us']:>8.1f}")


if __name__ == "__main__":
    try:
        main()
    except KernelfleetError as exc:  # no NVML or no GPU here: one line
        sys.exit(f"sampler_parts: {exc}")
