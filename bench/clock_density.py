"""Raw SM-clock reads at a fixed fast period under load, for the density study.

    python -m bench.clock_density --out DIR [--period 0.002] [--seconds 10]

Polls GPU 0's SM clock every ``period`` seconds while a bf16 GEMM loop and then a
transformer training loop run in a child process, and writes every read to
DIR/clock-reads.json.gz. Offline, ``docs/telemetry.md`` uses it to find how many
reads a window needs for its mean clock to be within a given error.
Also measures the CPU an idle process spends once NVML is initialised.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from bench import Parser
from kernelfleet.telemetry.nvml_api import Nvml

ROOT = Path(__file__).resolve().parents[1]
LOAD = "from bench import loops; loops.{}({})"


def main() -> None:
    parser = Parser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--period", type=float, default=0.002)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    nvml = Nvml()
    nvml.init()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    c0 = time.process_time()
    time.sleep(3.0)
    print(f"idle process CPU with NVML initialised: {(time.process_time() - c0) / 3 * 1e3:.3f} ms/s")
    runs = {}
    for load in ("gemm", "transformer"):
        child = subprocess.Popen([sys.executable, "-c", LOAD.format(load, args.seconds + 12)], cwd=ROOT)
        time.sleep(10.0)  # model build, warm-up, clocks settling under the power cap
        reads = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            reads.append((time.monotonic(), nvml.call("nvmlDeviceGetClockInfo", handle, nvml.m.NVML_CLOCK_SM)))
            time.sleep(args.period)
        child.wait()
        runs[load] = reads
        mhz = [r[1] for r in reads]
        print(f"{load}: {len(reads)} reads, clock {min(mhz)}..{max(mhz)} MHz")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "clock-reads.json.gz").write_bytes(gzip.compress(json.dumps(runs).encode()))
    nvml.shutdown()


if __name__ == "__main__":
    main()
