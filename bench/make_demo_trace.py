"""Build the bundled demo trace from the H200 recordings (what `watch --demo` replays).

    python3 bench/make_demo_trace.py

Concatenates tests/data/h200/h200-{idle,bf16-gemm,fp8-gemm,copy,transformer}
with timestamps shifted so the five runs follow one another, and writes
kernelfleet/data/demo-h200.jsonl.gz. The samples are the recorded ones.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kernelfleet.telemetry.replay import ReplaySource, TraceWriter

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("idle", "bf16-gemm", "fp8-gemm", "copy", "transformer")


def main() -> None:
    out = ROOT / "kernelfleet" / "data" / "demo-h200.jsonl.gz"
    clock = None
    with TraceWriter(out, note="H200 recordings back to back: " + ", ".join(PARTS)) as writer:
        for part in PARTS:
            batches = list(ReplaySource(ROOT / "tests" / "data" / "h200" / f"h200-{part}.jsonl.gz").batches())
            first = batches[0][0].timestamp_seconds
            clock = first if clock is None else clock
            for batch in batches:
                shift = clock - first
                writer.write([dataclasses.replace(s, timestamp_seconds=s.timestamp_seconds + shift) for s in batch])
            clock += batches[-1][0].timestamp_seconds - first + batches[-1][0].window_seconds
    print(f"wrote {writer.batches} windows to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
