"""Tables and plot for docs/validation/ofu.md from a recorded GEMM sweep (CPU only).

    python -m bench.plot_ofu_validation [--sweep tests/data/h200-sweep]

Reads sweep-points.jsonl.gz and sweep-trace.jsonl.gz (written by ``kernelfleet bench ofu``
on a GPU), prints the per-point table and the Table II summary in Markdown, and
draws docs/validation/ofu-vs-mfu-h200-sweep.png. Then prints the sampling study's table
(one clock read per window against the dense mean) from the recordings under tests/data.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure

from bench import Parser, command_line
from kernelfleet.catalog import Catalog
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.validation.mfu import gemm_points, summarize_errors
from kernelfleet.validation.sampling import clock_sampling_errors, instant_clock_errors_pp

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
# The sampling study's recordings: five single-GPU loops, and the two-GPU data-parallel job
# (each GPU a series of its own; only its densely read, busy clean phase counts as steady).
LOOPS = [DATA / "h200" / f"h200-{n}.jsonl.gz" for n in ("bf16-gemm", "fp8-gemm", "transformer")] + [
    DATA / "h200-detector" / f"h200-{n}.jsonl.gz" for n in ("drop", "gaps")]
DDP = DATA / "h200x2-detector" / "h200x2-ddp.jsonl.gz"


def main() -> None:
    parser = Parser()
    parser.add_argument("--sweep", type=Path, default=ROOT / "tests" / "data" / "h200-sweep")
    args = parser.parse_args()
    print(f"command: {command_line()}\n")
    with gzip.open(args.sweep / "sweep-points.jsonl.gz", "rt") as f:
        points = [json.loads(line) for line in f]
    samples = [b[0] for b in ReplaySource(args.sweep / "sweep-trace.jsonl.gz").batches()]
    h200 = Catalog.load().get("h200-sxm")
    rows = gemm_points(points, samples, h200)

    print("| precision | M×N×K | kernel tile (cuBLAS M×N×K) | windows | MFU | raw OFU | raw err | corrected OFU | corrected err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tile = f"{r.tile.m}×{r.tile.n}×{r.tile.k}" if r.tile else "?"
        if r.cluster and r.cluster != (1, 1):
            tile += f", cluster {r.cluster[0]}×{r.cluster[1]}"
        corrected = "—" if r.corrected_ofu_ratio is None else f"{r.corrected_ofu_ratio:.3f}"
        cerr = "—" if r.corrected_error_pp is None else f"{r.corrected_error_pp:+.2f}"
        print(f"| {r.precision} | {r.m}×{r.n}×{r.k} | {tile} | {r.windows} | {r.mfu_ratio:.3f} | "
              f"{r.raw_ofu_ratio:.3f} | {r.raw_error_pp:+.2f} | {corrected} | {cerr} |")
    print("\n| precision | points | raw MAE (pp) | raw ≤2 pp | raw ≤5 pp | corrected MAE (pp) | corrected ≤2 pp | corrected ≤5 pp |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summarize_errors(rows):
        print(f"| {s.precision} | {s.points} | {s.raw_mae_pp:.2f} | {s.raw_within_2pp:.0%} | {s.raw_within_5pp:.0%} | "
              f"{s.corrected_mae_pp:.2f} | {s.corrected_within_2pp:.0%} | {s.corrected_within_5pp:.0%} |")

    fig = Figure(figsize=(11, 5))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, corrected in zip(axes, (False, True)):
        for precision in dict.fromkeys(r.precision for r in rows):
            chosen = [r for r in rows if r.precision == precision and r.corrected_ofu_ratio is not None]
            y = [r.corrected_ofu_ratio if corrected else r.raw_ofu_ratio for r in chosen]
            ax.scatter([r.mfu_ratio for r in chosen], y, label=precision, s=20)
        ax.plot([0, 0.8], [0, 0.8], color="grey", ls="--", lw=1)
        ax.set(xlabel="MFU (CUDA events)",
               title="corrected OFU (tile and cluster padding removed)" if corrected else "raw OFU")
    hmma, dfma = (h200.ofu_reference_clock(pipe)[0] / 1e6 for pipe in ("hmma", "dfma"))
    axes[0].set_ylabel(f"OFU (f_ref {hmma:.0f} MHz; fp64 {dfma:.0f} MHz)")
    axes[0].legend()
    fig.suptitle("H200 GEMM sweep: OFU against MFU, one point per shape and precision")
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "validation" / "ofu-vs-mfu-h200-sweep.png", dpi=110)
    sampling_table(samples)


def _p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * len(xs))]


def sampling_table(sweep: list) -> None:
    """The sampling study: one clock read per window against the window's dense mean."""
    h200 = Catalog.load().get("h200-sxm")
    runs = json.loads(gzip.decompress((DATA / "h200" / "clock-reads-2ms.json.gz").read_bytes()))
    loops = [[b[0] for b in ReplaySource(p).batches()] for p in LOOPS]
    ddp = [s for b in ReplaySource(DDP).batches() for s in b]
    print("\n| window | source | windows | mean error | p95 error |")
    print("|---|---|---|---|---|")
    for window, label in ((0.1, "100 ms"), (1.0, "1 s")):
        errors = [[100 * e for e in clock_sampling_errors([(t, mhz * 1e6) for t, mhz in runs[k]], window, 1)]
                  for k in ("gemm", "transformer")]
        print(f"| {label} | 2-ms reads, GEMM / transformer | {len(errors[0])} / {len(errors[1])} | "
              f"{statistics.mean(errors[0]):.2f} % / {statistics.mean(errors[1]):.2f} % of clock | "
              f"{_p95(errors[0]):.2f} % / {_p95(errors[1]):.2f} % |")

    def row(label: str, series: list[list], window: float, steady: bool) -> None:
        errors = [e for s in series for e in instant_clock_errors_pp(s, h200, window, steady_only=steady)]
        p95 = f"{_p95(errors):.2f} pp" if len(errors) >= 20 else f"max {max(errors):.2f} pp" if errors else "—"
        mean = f"{statistics.mean(errors):.2f} pp" if errors else "—"
        print(f"| {window:g} s | {label} | {len(errors)} | {mean} | {p95} |")

    for window in (1.0, 10.0, 30.0):
        row("loops + DDP (2 GPUs), steady", loops + [ddp], window, True)
    for window in (1.0, 10.0, 30.0):
        row("DDP (2 GPUs) alone, steady", [ddp], window, True)
    for window in (10.0, 30.0):
        row("loops, all windows (starts, ends, pauses)", loops, window, False)
    for window in (1.0, 10.0, 30.0):
        row("GEMM sweep, all windows", [sweep], window, False)


if __name__ == "__main__":
    main()
