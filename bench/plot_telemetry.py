"""Plots and tables for docs/telemetry.md from the committed H200 recordings (CPU only).

    python -m bench.plot_telemetry

Writes docs/img/ofu-vs-mfu-h200.png and docs/img/clock-sampling-h200.png, and
prints the tables the document quotes.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure

from bench import command_line
from kernelfleet.catalog import Catalog
from kernelfleet.ofu.core import ofu_ratio
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.validation.sampling import clock_sampling_errors
from kernelfleet.validation.timeline import work_between

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "h200"
IMG = ROOT / "docs" / "img"
WORKLOADS = (("bf16-gemm", "bf16", "bf16 8192³ GEMM"), ("fp8-gemm", "fp8", "fp8 8192³ GEMM"),
             ("transformer", "bf16", "bf16 transformer training"))


def windows(name: str, precision: str, peak_flops: float) -> list[tuple[float, float, float]]:
    """(tensor_active, mean clock Hz, MFU) for every window the loop kept busy throughout."""
    tl = json.loads(gzip.decompress((DATA / f"timeline-{name}.json.gz").read_bytes()))
    out = []
    for (s,) in ReplaySource(DATA / f"h200-{name}.jsonl.gz").batches():
        start, end = s.timestamp_seconds - s.window_seconds, s.timestamp_seconds
        if not (tl["start_wall"] < start and tl["ends_wall"][-1] > end):
            continue
        work = work_between(tl["start_wall"], tl["ends_wall"], tl["work_per_iteration"], start, end)
        out.append((s.tensor_active_ratio, s.sm_clock_mean_hertz, work / s.window_seconds / peak_flops))
    return out


def main() -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    print(f"command: {command_line()}")
    h200 = Catalog.load().get("h200-sxm")
    fig = Figure(figsize=(6, 5))
    ax = fig.subplots()
    print("| workload | windows | MFU | OFU @1980 | error | OFU @1830 | error |")
    for (name, precision, label), color in zip(WORKLOADS, ("C0", "C1", "C2")):
        rows = windows(name, precision, h200.peak_flops(precision))
        mfu = [m for _, _, m in rows]
        at = {f: [ofu_ratio(t, c, f) for t, c, _ in rows] for f in (1.98e9, 1.83e9)}
        ax.scatter(mfu, at[1.98e9], color=color, label=f"{label}, f_ref 1980 MHz", s=18)
        ax.scatter(mfu, at[1.83e9], color=color, marker="x", label=f"{label}, f_ref 1830 MHz", s=18)
        err = {f: statistics.mean(o - m for o, m in zip(at[f], mfu)) * 100 for f in at}
        print(f"| {label} | {len(rows)} | {statistics.mean(mfu):.3f} | {statistics.mean(at[1.98e9]):.3f} | "
              f"{err[1.98e9]:+.2f} pp | {statistics.mean(at[1.83e9]):.3f} | {err[1.83e9]:+.2f} pp |")
    ax.plot([0.3, 0.8], [0.3, 0.8], color="grey", lw=1, ls="--", label="OFU = MFU")
    ax.set(xlabel="MFU (FLOPs timed with CUDA events / datasheet dense peak)", ylabel="OFU",
           title="H200: OFU against MFU, 1-s windows")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(IMG / "ofu-vs-mfu-h200.png", dpi=120)

    runs = json.loads(gzip.decompress((DATA / "clock-reads-2ms.json.gz").read_bytes()))
    counts = (1, 2, 5, 10, 20, 50)
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    print("\n| load | reads per 1-s window | mean error | p95 error |")
    for load, label in (("gemm", "bf16 GEMM"), ("transformer", "transformer training")):
        reads = [(t, mhz * 1e6) for t, mhz in runs[load]]
        p95s = []
        for n in counts:
            errors = sorted(clock_sampling_errors(reads, 1.0, n))
            p95s.append(errors[int(0.95 * len(errors))] * 100)
            print(f"| {label} | {n} | {statistics.mean(errors) * 100:.2f} % | {p95s[-1]:.2f} % |")
        ax.plot(counts, p95s, marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="SM clock reads per 1-s window",
           ylabel="p95 error of the window's mean clock (%)", title="H200: clock sampling error")
    ax.axvline(10, color="grey", ls="--", lw=1)
    ax.text(10.5, ax.get_ylim()[1] * 0.5, "default (every 100 ms)", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(IMG / "clock-sampling-h200.png", dpi=120)


if __name__ == "__main__":
    main()
