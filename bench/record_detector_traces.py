"""Record traces for the regression detector's tests, on a GPU.

    python -m bench.record_detector_traces --out DIR

drop: a bf16 8192^3 GEMM loop runs cleanly for 45 s, then the same loop with a
host synchronisation and a 2.5 ms sleep after every GEMM (the kind of
per-step stall a debug flag or a blocking logger adds) for 45 s: OFU falls ~2.5x.
gaps: the clean loop in three 20-s stretches with 6-s pauses between them
(checkpointing): a detector must not call the pauses a regression.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

from bench import Parser


def loop(seconds: float, stall: float = 0.0) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(a, b)
        if stall:
            torch.cuda.synchronize()
            time.sleep(stall)
    torch.cuda.synchronize()


def record(out: Path, name: str, seconds: float, note: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kernelfleet", "record", "-o", str(out / f"h200-{name}.jsonl.gz"),
                             "--duration", str(seconds), "--note", note])


def main() -> None:
    parser = Parser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    loop(2.0)  # warm-up: cuBLAS handles, clocks
    rec = record(args.out, "drop", 94, "bf16 8192^3 loop: 45 s clean, then 45 s with sync + 2.5 ms sleep per GEMM")
    time.sleep(2.0)
    loop(45.0)
    loop(45.0, stall=0.0025)
    rec.wait()
    rec = record(args.out, "gaps", 76, "bf16 8192^3 loop: 3 x 20 s with 6-s pauses (checkpointing)")
    time.sleep(2.0)
    for i in range(3):
        loop(20.0)
        if i < 2:
            time.sleep(6.0)
    rec.wait()


if __name__ == "__main__":
    main()
