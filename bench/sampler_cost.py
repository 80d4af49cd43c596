"""Benchmark: CPU cost of the NVML sampler per GPU per sample (target < 1 ms), with the
accuracy each clock-read period buys.

    python3 bench/sampler_cost.py [--windows 5] [--interval 1.0]

Runs NvmlSource for a few windows at several SM-clock read periods and reports
the process CPU time (main thread + clock thread) per GPU per window. The
baseline in the same run is the GPM sample-pair read with one clock read per
window. Beside each row: the p95 error of a 1-s window's mean clock at that
read density, from 2-ms reads recorded under a transformer training loop on an
H200 (tests/data/h200/clock-reads-2ms.json.gz).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from kernelfleet.ofu.sampling import clock_sampling_errors
from kernelfleet.telemetry.nvml import NvmlSource

READS = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200" / "clock-reads-2ms.json.gz"


def measure(poll_seconds: float, windows: int, interval: float) -> tuple[float, int, float]:
    with NvmlSource(interval_seconds=interval, clock_poll_seconds=poll_seconds) as source:
        gpus = 1
        cpu0 = time.process_time()
        polls = 0
        for batch in source.batches(count=windows):
            gpus = len(batch)
            polls += sum(s.sm_clock_polls for s in batch)
        cpu = time.process_time() - cpu0
        t0 = time.thread_time()
        source.read()  # the read alone, main thread, for the breakdown
        read_cpu = time.thread_time() - t0
    return cpu / windows / gpus, polls // windows // gpus, read_cpu / gpus


def p95_clock_error(reads_per_window: int) -> float:
    runs = json.loads(gzip.decompress(READS.read_bytes()))
    errors = sorted(clock_sampling_errors([(t, m * 1e6) for t, m in runs["transformer"]], 1.0, reads_per_window))
    return errors[int(0.95 * len(errors))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    print(f"command: {' '.join([sys.executable] + sys.argv)}")
    print(f"{'clock read every':>16} {'reads/window':>13} {'CPU ms/GPU/sample':>18} {'read() ms':>10} {'clock p95 err':>14}")
    for poll in (args.interval, 0.2, 0.1, 0.05):
        per_sample, polls, read = measure(poll, args.windows, args.interval)
        label = f"{poll * 1000:.0f} ms" + (" (baseline)" if poll == args.interval else "")
        error = p95_clock_error(max(1, round(args.interval / poll)))
        print(f"{label:>16} {polls:>13} {per_sample * 1000:>18.3f} {read * 1000:>10.3f} {error * 100:>13.2f}%")


if __name__ == "__main__":
    main()
