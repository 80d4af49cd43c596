"""Benchmark: CPU and wall cost of each NVML call the sampler makes, on GPU 0.

    python -m bench.nvml_calls [--reps 200]

Finds which call dominates the sampler's cost, and what one clock read costs in
the sampler loop (the read, and the sleep and wake-up before it).
"""

from __future__ import annotations

import threading
import time

from bench import Parser, command_line
from bench.sampler_parts import gpm_pair
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml


def main() -> None:
    parser = Parser()
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    print(f"command: {command_line()}")
    nvml = Nvml()
    nvml.init()
    m = nvml.m
    h = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    s1, s2 = gpm_pair(nvml, h)

    def metrics() -> None:
        req = m.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics, req.sample1, req.sample2 = m.NVML_GPM_METRICS_GET_VERSION, 15, s1, s2
        for i, mid in enumerate((5, 7, 9, 6, 2, 3, 10, 13, 12, 11, 4, 20, 21, 61, 60)):
            req.metrics[i].metricId = mid
        m.nvmlGpmMetricsGet(req)

    def proc_util() -> None:
        try:
            m.nvmlDeviceGetProcessUtilization(h, int((time.time() - 1) * 1e6))
        except m.NVMLError:
            pass

    def alloc_free() -> None:
        m.nvmlGpmSampleFree(m.nvmlGpmSampleAlloc())

    # The health reads (telemetry/health.py): one of each a window per GPU; an unsupported one
    # costs its failed call, which is what the sampler pays for it too.
    events = m.nvmlEventSetCreate()
    try:
        m.nvmlDeviceRegisterEvents(h, m.nvmlEventTypeXidCriticalError, events)
    except m.NVMLError as exc:
        print(f"Xid events not available here ({exc}): the wait below times an empty set")

    def answered(fn, *args) -> None:
        try:
            fn(*args)
        except m.NVMLError:
            pass  # NOT_SUPPORTED, or TIMEOUT from an empty event set: the usual answer

    health = {
        "nvmlDeviceGetTemperature": lambda: answered(m.nvmlDeviceGetTemperature, h, m.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: answered(m.nvmlDeviceGetCurrentClocksEventReasons, h),
        "nvmlDeviceGetTotalEccErrors (x2)": lambda: [answered(m.nvmlDeviceGetTotalEccErrors, h, kind, m.NVML_VOLATILE_ECC)
                                                     for kind in (0, 1)],
        "nvmlEventSetWait_v2(0 ms, empty)": lambda: answered(m.nvmlEventSetWait_v2, events, 0),
    }

    calls = {
        "nvmlGpmSampleAlloc + Free": alloc_free,
        "nvmlDeviceGetClockInfo(SM)": lambda: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_SM),
        "nvmlGpmSampleGet": lambda: m.nvmlGpmSampleGet(h, s2),
        "nvmlGpmMetricsGet(15 metrics)": metrics,
        "nvmlDeviceGetTotalEnergyConsumption": lambda: m.nvmlDeviceGetTotalEnergyConsumption(h),
        "nvmlDeviceGetComputeRunningProcesses": lambda: m.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlDeviceGetProcessUtilization": proc_util,
        "nvmlDeviceGetMemoryInfo": lambda: m.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetPowerUsage": lambda: m.nvmlDeviceGetPowerUsage(h),
        **health,
    }
    print(f"{'call':40} {'CPU us':>9} {'wall us':>9}")
    for name, fn in calls.items():
        fn()
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(args.reps):
            fn()
        cpu = (time.process_time() - c0) / args.reps * 1e6
        wall = (time.perf_counter() - w0) / args.reps * 1e6
        print(f"{name:40} {cpu:9.1f} {wall:9.1f}")
    for _ in (s1, s2):
        m.nvmlGpmSampleFree(_)
    m.nvmlEventSetFree(events)
    nvml.shutdown()
    poll_loop_costs(args.reps)


def poll_loop_costs(reps: int) -> None:
    """The sampler loop's cost per clock read: the read, and the sleep/wake-up before it."""
    with NvmlSource() as source:
        c0 = time.process_time()
        for _ in range(reps):
            source.poll_clocks()
        reads = (time.process_time() - c0) / reps * 1e6
    waiter = threading.Event()
    c0 = time.process_time()
    for _ in range(50):
        waiter.wait(0.02)
    event_wait = (time.process_time() - c0) / 50 * 1e6
    c0 = time.process_time()
    for _ in range(50):
        time.sleep(0.02)
    sleep = (time.process_time() - c0) / 50 * 1e6
    print(f"{'poll_clocks() (1 GPU)':40} {reads:9.1f}")
    print(f"{'Event.wait(20 ms) wake-up':40} {event_wait:9.1f}")
    print(f"{'time.sleep(20 ms) wake-up':40} {sleep:9.1f}")


if __name__ == "__main__":
    main()
