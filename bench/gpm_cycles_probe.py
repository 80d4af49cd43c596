"""Which GPM cycle counters this driver answers, and what their values mean (run on a GPU).

    python3 bench/gpm_cycles_probe.py

Takes two GPM samples 2 s apart on GPU 0 while a bf16 GEMM loop runs in a child process,
reads the SM clock every 10 ms in between, and asks for each cumulative counter of
NVML_GPM_METRIC 248-260 (SM_CYCLES_ELAPSED, SM_CYCLES_ACTIVE, MMA_CYCLES_ACTIVE, ...) in a
call of its own. It prints each raw value beside value / window seconds and that per SM, next
to the polled mean clock and ANY_TENSOR_UTIL, so one run tells whether the counters give the
window's mean clock (no polling) and tensor-busy cycles. On the H200 with driver 580.159.04 every
counter of 248-259 answered NVML code 2 (invalid argument) under load (docs/telemetry.md).
"""

from __future__ import annotations

import subprocess
import sys
import time

from kernelfleet.telemetry.nvml_api import Nvml

COUNTERS = {248: "SM_CYCLES_ELAPSED", 249: "SM_CYCLES_ACTIVE", 250: "MMA_CYCLES_ACTIVE", 251: "DMMA_CYCLES_ACTIVE",
            252: "HMMA_CYCLES_ACTIVE", 253: "IMMA_CYCLES_ACTIVE", 254: "DFMA_CYCLES_ACTIVE",
            257: "INTEGER_CYCLES_ACTIVE", 259: "FP32_CYCLES_ACTIVE", 5: "ANY_TENSOR_UTIL (%)", 2: "SM_UTIL (%)"}
LOAD = "import sys; sys.path.insert(0, 'bench'); import loops; loops.gemm(16.0)"


def main() -> None:
    print(f"command: {' '.join([sys.executable] + sys.argv)}")
    nvml = Nvml()
    nvml.init()
    m = nvml.m
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    sms = nvml.optional("nvmlDeviceGetNumGpuCores", handle)
    child = subprocess.Popen([sys.executable, "-c", LOAD])
    time.sleep(8.0)  # torch import, CUDA start-up, warm-up and clocks settling under load
    first, second = nvml.call("nvmlGpmSampleAlloc"), nvml.call("nvmlGpmSampleAlloc")
    nvml.call("nvmlGpmSampleGet", handle, first)
    t0 = time.monotonic()
    clocks = []
    while time.monotonic() - t0 < 2.0:
        clocks.append(nvml.call("nvmlDeviceGetClockInfo", handle, m.NVML_CLOCK_SM))
        time.sleep(0.01)
    nvml.call("nvmlGpmSampleGet", handle, second)
    window = time.monotonic() - t0
    child.wait()
    print(f"window {window:.3f} s, polled mean SM clock {sum(clocks) / len(clocks):.1f} MHz ({len(clocks)} reads), "
          f"CUDA cores reported {sms}")
    for metric_id, name in COUNTERS.items():
        request = m.c_nvmlGpmMetricsGet_t()
        request.version, request.numMetrics = m.NVML_GPM_METRICS_GET_VERSION, 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = metric_id
        try:
            m.nvmlGpmMetricsGet(request)
        except m.NVMLError as exc:
            print(f"{metric_id:4} {name:24} call failed: {exc}")
            continue
        metric = request.metrics[0]
        if metric.nvmlReturn != m.NVML_SUCCESS:
            print(f"{metric_id:4} {name:24} not answered (NVML code {metric.nvmlReturn})")
            continue
        v = metric.value
        print(f"{metric_id:4} {name:24} raw {v:.6g}   /window {v / window:.6g}/s   /window/132 {v / window / 132:.6g}/s")
    nvml.shutdown()


if __name__ == "__main__":
    main()
