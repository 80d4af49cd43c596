"""Benchmark: CPU cost of the NVML sampler per GPU per sample (target < 1 ms), with the
accuracy each clock-read period buys, idle and under load.

    python -m bench.sampler_cost [--windows 10] [--interval 1.0] [--load-seconds 40]

Runs NvmlSource for a few windows in three modes: one clock read per window (the floor),
a read every 100 ms (dense, the old default), and the adaptive default (every 100 ms only
while some GPU's clock moved in the last window). Each mode runs with the GPUs idle and
again while every GPU runs a bf16 GEMM loop (a child process per GPU). Reported: process
CPU (all threads) per GPU per window, with its parts: the CPU inside NVML calls on the main
thread, the rest of the main thread (Python, sleeps and wake-ups), and other threads
(NVML's own). Beside each row: the p95 error of a 1-s window's mean clock at that read
density, from 2-ms reads recorded under a transformer loop on an H200
(tests/data/h200/clock-reads-2ms.json.gz).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from bench import command_line
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.validation.sampling import clock_sampling_errors

ROOT = Path(__file__).resolve().parents[1]
READS = ROOT / "tests" / "data" / "h200" / "clock-reads-2ms.json.gz"
GEMM = "from bench import loops; loops.gemm({})"


def thread_cpu() -> dict[int, float]:
    """CPU seconds of every thread of this process (schedstat: nanosecond resolution)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            continue
    return out


class TimedNvml:
    """Wraps the source's NVML doorway to add up the main thread's CPU inside each call."""

    def __init__(self, nvml) -> None:
        self._nvml = nvml
        self.cpu: dict[str, float] = defaultdict(float)

    def __getattr__(self, name):
        return getattr(self._nvml, name)

    def _timed(self, how, function, *args):
        t0 = time.thread_time()
        try:
            return how(function, *args)
        finally:
            self.cpu[function] += time.thread_time() - t0

    def call(self, function, *args):
        return self._timed(self._nvml.call, function, *args)

    def optional(self, function, *args):
        return self._timed(self._nvml.optional, function, *args)


def measure(poll: float, adaptive: bool, windows: int, interval: float) -> dict:
    source = NvmlSource(interval_seconds=interval, clock_poll_seconds=poll, adaptive_clock_poll=adaptive)
    timed = TimedNvml(source.nvml)
    source.nvml = timed
    with source:
        main = threading.get_native_id()
        gpus, polls = 1, 0
        next(iter(source.batches(count=1)))  # one window first: adaptive mode starts dense
        timed.cpu.clear()
        before, cpu0, main0 = thread_cpu(), time.process_time(), time.thread_time()
        for batch in source.batches(count=windows):
            gpus = len(batch)
            polls += sum(s.sm_clock_polls for s in batch)
        cpu, main_cpu, after = time.process_time() - cpu0, time.thread_time() - main0, thread_cpu()
    others = sum(after[t] - before.get(t, 0.0) for t in after if t != main)
    nvml = sum(timed.cpu.values())
    per = windows * gpus * 1e-3
    top = sorted(timed.cpu.items(), key=lambda kv: -kv[1])[:3]
    return {"ms": cpu / per, "reads": polls / windows / gpus, "nvml_ms": nvml / per,
            "python_ms": (main_cpu - nvml) / per, "others_ms": others / per, "gpus": gpus,
            "top": ", ".join(f"{name.removeprefix('nvml')} {t / per:.3f}" for name, t in top)}


def p95_clock_error(reads_per_window: float) -> float:
    """The p95 error of a window's mean clock while the clock swings (a transformer loop)."""
    runs = json.loads(gzip.decompress(READS.read_bytes()))
    errors = sorted(clock_sampling_errors([(t, m * 1e6) for t, m in runs["transformer"]], 1.0,
                                          max(1, round(reads_per_window))))
    return errors[int(0.95 * len(errors))]


def gpu_count() -> int:
    with NvmlSource() as source:
        return len(source.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--load-seconds", type=float, default=0.0,
                        help="also measure under a bf16 GEMM loop on every GPU, which runs this long (0: idle only)")
    args = parser.parse_args()
    print(f"command: {command_line()}")
    modes = [("one read/window", args.interval, False), ("every 100 ms", 0.1, False), ("adaptive (default)", 0.1, True)]
    loads = ["idle"] + (["bf16 GEMM loop"] if args.load_seconds else [])
    print(f"{'load':>15} {'clock reads':>19} {'reads/win':>9} {'CPU ms/GPU/sample':>18} {'in NVML':>8} "
          f"{'Python+wake':>11} {'other thr':>9} {'swing p95 err':>13}  top NVML calls (ms)")
    for load in loads:
        children = []
        if load != "idle":
            for gpu in range(gpu_count()):
                env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
                children.append(subprocess.Popen([sys.executable, "-c", GEMM.format(args.load_seconds)], env=env,
                                                 cwd=ROOT))
            time.sleep(8.0)  # CUDA start-up and warm-up
        for label, poll, adaptive in modes:
            r = measure(poll, adaptive, args.windows, args.interval)
            error = p95_clock_error(args.interval / poll)  # adaptive polls densely whenever the clock moves
            print(f"{load:>15} {label:>19} {r['reads']:>9.1f} {r['ms']:>18.3f} {r['nvml_ms']:>8.3f} "
                  f"{r['python_ms']:>11.3f} {r['others_ms']:>9.3f} {error * 100:>12.2f}%  {r['top']}", flush=True)
        for child in children:
            child.kill()
            child.wait()
    print("swing p95 err: a 1-s window's clock error at that read density while the clock swings (2-ms reads under a "
          "transformer loop on an H200); adaptive reads densely while a clock moves, so it has dense's error there")


if __name__ == "__main__":
    main()
