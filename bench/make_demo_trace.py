"""Build the bundled demo trace from the H200 recordings (what `watch --demo` replays).

    python -m bench.make_demo_trace

Concatenates H200 recordings — a GEMM loop that slows down 2.5x halfway (so the
demo shows a regression), then bf16 GEMM, fp8 GEMM, copy, transformer training
and idle — with timestamps shifted so the runs follow one another, and writes
kernelfleet/data/demo-h200.jsonl.gz. The samples are the recorded ones.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kernelfleet.telemetry.replay import ReplaySource, TraceWriter

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("h200-detector/h200-drop", "h200/h200-bf16-gemm", "h200/h200-fp8-gemm", "h200/h200-copy",
         "h200/h200-transformer", "h200/h200-idle")


def main() -> None:
    out = ROOT / "kernelfleet" / "data" / "demo-h200.jsonl.gz"
    clock = None
    with TraceWriter(out, note="H200 recordings back to back: " + ", ".join(p.split("/")[1] for p in PARTS)) as writer:
        for part in PARTS:
            batches = list(ReplaySource(ROOT / "tests" / "data" / f"{part}.jsonl.gz").batches())
            first = batches[0][0].timestamp_seconds
            clock = first if clock is None else clock
            for batch in batches:
                shift = clock - first
                writer.write([dataclasses.replace(s, timestamp_seconds=s.timestamp_seconds + shift) for s in batch])
            clock += batches[-1][0].timestamp_seconds - first + batches[-1][0].window_seconds
    print(f"wrote {writer.batches} windows to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
