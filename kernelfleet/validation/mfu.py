"""OFU against measured MFU for controlled GEMMs (the paper's Table II, on our runs).

Inputs are plain data recorded on a GPU by ``kernelfleet bench ofu``: the sweep's
points (shape, precision, kernel names, CUDA-event timeline) and the counter
trace sampled alongside. For every window that lies wholly inside a point's
timed run, MFU is the FLOPs the timeline completed in the window over the
window and the precision's dense peak; raw OFU comes from the window's counters;
corrected OFU removes the padded tile work of the kernel that ran (its tile, and
its thread-block cluster where the name states one: ``ofu/kernel_tiles.py``).

OFU here is normalised by the f_ref of the point's own precision (``Sku.ofu_reference_clock_of``),
as the agent's per-pipe choice would give for a window of one precision's GEMMs. Why that f_ref
differs from the datasheet's clock is the clock check's finding (``validation/clock_check.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from kernelfleet.catalog import Sku
from kernelfleet.ofu.core import ofu
from kernelfleet.ofu.kernel_tiles import (
    cluster_from_kernel_name,
    executed_flops_of_kernel,
    tile_from_kernel_name,
)
from kernelfleet.ofu.tiles import Tile, corrected_ofu, gemm_flops
from kernelfleet.telemetry.sample import Sample
from kernelfleet.validation.timeline import work_between

# The datasheet peak each sweep precision is measured against.
PEAK_OF = {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32", "fp8": "fp8", "fp64": "fp64_tensor"}
# Issue 4's targets: corrected MAE against MFU, percentage points.
TARGET_MAE_PP = {"bf16": 0.5, "fp16": 0.5, "tf32": 1.0, "fp8": 1.0}


@dataclass(frozen=True, slots=True)
class GemmPoint:
    """One sweep point: its windows' mean MFU, raw OFU and corrected OFU."""

    precision: str
    m: int
    n: int
    k: int
    kernel: str | None
    tile: Tile | None
    windows: int
    mfu_ratio: float
    raw_ofu_ratio: float
    corrected_ofu_ratio: float | None  # None when the kernel's tile is unknown
    cluster: tuple[int, int] | None = None  # thread-block cluster along the tile's sides (nvjet)

    @property
    def raw_error_pp(self) -> float:
        return 100 * (self.raw_ofu_ratio - self.mfu_ratio)

    @property
    def corrected_error_pp(self) -> float | None:
        return None if self.corrected_ofu_ratio is None else 100 * (self.corrected_ofu_ratio - self.mfu_ratio)


def point_windows(p: dict[str, Any], samples: Sequence[Sample], sku: Sku) -> list[tuple[Sample, float, float]]:
    """The windows wholly inside a sweep point's timed run, each with its MFU and raw OFU."""
    peak = sku.peak_flops(PEAK_OF[p["precision"]])
    if "error" in p or peak is None:
        return []
    out = []
    for s in samples:
        start = s.timestamp_seconds - s.window_seconds
        if not (start > p["start_wall"] and s.timestamp_seconds < p["ends_wall"][-1]):
            continue
        reading = ofu(s, sku, PEAK_OF[p["precision"]])
        if reading.ofu_ratio is None:
            continue
        work = work_between(p["start_wall"], p["ends_wall"], p["work_per_iteration"], start, s.timestamp_seconds)
        out.append((s, work / s.window_seconds / peak, reading.ofu_ratio))
    return out


def gemm_points(points: Iterable[dict[str, Any]], samples: Sequence[Sample], sku: Sku) -> list[GemmPoint]:
    """Match windows to sweep points and compute MFU and OFU per point."""
    out = []
    for p in points:
        pairs = [(mfu, raw) for _, mfu, raw in point_windows(p, samples, sku)]
        if not pairs:
            continue
        kernel = next((name for name in p["kernels"] if tile_from_kernel_name(name)), None)
        tile = tile_from_kernel_name(kernel) if kernel else None
        raw = statistics.mean(o for _, o in pairs)
        m, n, k = p["m"], p["n"], p["k"]
        executed = executed_flops_of_kernel(m, n, k, kernel) if kernel else None
        corrected = None if executed is None else corrected_ofu(raw, gemm_flops(m, n, k), executed)
        out.append(GemmPoint(p["precision"], p["m"], p["n"], p["k"], kernel, tile, len(pairs),
                             statistics.mean(m for m, _ in pairs), raw, corrected,
                             cluster_from_kernel_name(kernel) if kernel else None))
    return out


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """The paper's Table II columns for one precision."""

    precision: str
    points: int
    raw_mae_pp: float
    raw_within_2pp: float
    raw_within_5pp: float
    corrected_mae_pp: float
    corrected_within_2pp: float
    corrected_within_5pp: float


def summarize_errors(points: Sequence[GemmPoint]) -> list[ErrorSummary]:
    """Per precision, over the points whose kernel tile is known (so both columns cover the same points)."""
    rows = []
    for precision in dict.fromkeys(p.precision for p in points):
        chosen = [p for p in points if p.precision == precision and p.corrected_error_pp is not None]
        if not chosen:
            continue
        raw = [abs(p.raw_error_pp) for p in chosen]
        fixed = [abs(p.corrected_error_pp) for p in chosen]  # type: ignore[arg-type]
        share = lambda xs, limit: sum(x <= limit for x in xs) / len(xs)  # noqa: E731
        rows.append(ErrorSummary(precision, len(chosen), statistics.mean(raw), share(raw, 2), share(raw, 5),
                                 statistics.mean(fixed), share(fixed, 2), share(fixed, 5)))
    return rows


def centred(points: Sequence[GemmPoint]) -> tuple[float, list[GemmPoint]]:
    """In-sample only, for comparison: the factor that, applied to OFU, centres these points' corrected
    errors on zero (mean corrected OFU = mean MFU), and the points at it. Dividing f_ref by the factor
    gives the clock such a fit would choose; it is no measurement, it is MFU fitted to itself."""
    chosen = [p for p in points if p.corrected_ofu_ratio is not None]
    factor = statistics.mean(p.mfu_ratio for p in chosen) / statistics.mean(p.corrected_ofu_ratio for p in chosen)  # type: ignore[misc]
    return factor, [dataclasses.replace(p, raw_ofu_ratio=p.raw_ofu_ratio * factor,
                                        corrected_ofu_ratio=p.corrected_ofu_ratio * factor)  # type: ignore[operator]
                    for p in chosen]
