"""``bench ofu-report``'s sections as rows: Table II, the Nsight Compute check, the clock check.

Each function takes what ``validation/files.py`` read and returns plain records, so a test checks
exact values and ``validation/markdown.py`` only formats them (docs/validation/ofu.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kernelfleet.catalog import Sku
from kernelfleet.errors import UsageError
from kernelfleet.telemetry.ncu import parse_ncu_csv
from kernelfleet.validation import clock_check
from kernelfleet.validation.clock_check import ClockVerdict, LoopClock, NcuClock
from kernelfleet.validation.files import ClockRun, NcuRun, Sweep
from kernelfleet.validation.mfu import (
    PEAK_OF,
    TARGET_MAE_PP,
    ErrorSummary,
    centred,
    gemm_points,
    summarize_errors,
)
from kernelfleet.validation.ncu import (
    ClockCheck,
    NcuPoint,
    NcuSummary,
    clock_checks,
    merge_runs,
    ncu_points,
    summarize,
)


@dataclass(frozen=True, slots=True)
class ReferenceClock:
    """The f_ref one precision's OFU was normalised by, and what it rests on."""

    precision: str
    hertz: float
    basis: str  # "measured" (peak clock / the probe's cycle ratio) or "datasheet"
    peak_clock_hertz: float  # the clock the datasheet's dense peak is quoted at


@dataclass(frozen=True, slots=True)
class Target:
    """A precision's corrected MAE against issue 4's target."""

    precision: str
    corrected_mae_pp: float
    target_mae_pp: float

    @property
    def miss_pp(self) -> float:
        """How far the MAE lies above the target (zero or below: met)."""
        return self.corrected_mae_pp - self.target_mae_pp


@dataclass(frozen=True, slots=True)
class TableII:
    """The paper's Table II on a recorded sweep, the f_ref of each precision, the targets, and an
    in-sample fit beside them (each precision's f_ref fitted so its corrected errors average zero)."""

    errors: list[ErrorSummary]
    reference_clocks: list[ReferenceClock]
    targets: list[Target]
    fitted_clock_hertz: dict[str, float]  # precision -> the f_ref the in-sample fit would choose
    fitted_errors: list[ErrorSummary]


def table_ii(sweep: Sweep, sku: Sku) -> TableII:
    """Table II of a sweep on ``sku``: MFU and OFU per point (``validation.mfu.gemm_points``), summarised."""
    gemm = gemm_points(sweep.points, sweep.samples, sku)
    errors = summarize_errors(gemm)
    refs = {s.precision: sku.ofu_reference_clock_of(PEAK_OF[s.precision]) for s in errors}
    fits = {q: centred([p for p in gemm if p.precision == q]) for q in refs}
    return TableII(
        errors,
        [ReferenceClock(q, hz, basis, sku.peak_clock(PEAK_OF[q])) for q, (hz, basis) in refs.items()],
        [Target(s.precision, s.corrected_mae_pp, TARGET_MAE_PP[s.precision]) for s in errors
         if s.precision in TARGET_MAE_PP],
        {q: refs[q][0] / factor for q, (factor, _) in fits.items()},
        summarize_errors([p for _, moved in fits.values() for p in moved]),
    )


@dataclass(frozen=True, slots=True)
class NcuKernelRow:
    """One profiled sweep kernel: its implied SM clock, beside what ncu counted for it."""

    check: ClockCheck
    profiled: NcuPoint


@dataclass(frozen=True, slots=True)
class NcuSection:
    """The Nsight Compute check of a sweep: per precision, then per kernel."""

    runs: int
    sweep_points: int
    profiled: list[NcuPoint]  # merged over the runs: a later run's point replaces an earlier one's
    summaries: list[NcuSummary]
    kernels: list[NcuKernelRow]


def ncu_section(runs: Sequence[NcuRun], sweep: Sweep, sku: Sku) -> NcuSection:
    """The ncu runs of a sweep against its points and counter windows."""
    profiled = merge_runs(*(ncu_points(run.order, sweep.points, parse_ncu_csv(run.csv_text), sku.sm_count)
                            for run in runs))
    checks = clock_checks(sweep.points, sweep.samples, sku, profiled)
    by_shape = {(p.precision, p.m, p.n, p.k): p for p in profiled}
    return NcuSection(len(runs), len(sweep.points), profiled, summarize(profiled, checks, sku.sm_count),
                      [NcuKernelRow(c, by_shape[c.precision, c.m, c.n, c.k]) for c in checks])


@dataclass(frozen=True, slots=True)
class LoopRow:
    """One clock-check loop, with ncu's figures for the same GEMM where it profiled one."""

    clock: LoopClock
    ncu_cycles_over_nvml: float | None  # ncu's cycles per kernel ÷ the loop's time per kernel ÷ NVML
    ncu_over_probe: float | None  # ncu's clock over the probe's, where both ran at one operating point


@dataclass(frozen=True, slots=True)
class ClockSection:
    """The clock check: its loops, the launches under ncu, the verdict, and the catalog's ratios
    (``catalog_ratios`` is empty unless the verdict is "cycles")."""

    loops: list[LoopRow]
    ncu: list[NcuClock]
    ncu_left_out: str | None  # why the ncu half could not be used; the loops still decide
    verdict: ClockVerdict
    sku_key: str
    catalog_ratios: dict[str, float]  # Sku.tensor_clock_ratio: f_ref = peak clock / ratio


def clock_section(run: ClockRun, sku: Sku) -> ClockSection:
    """The clock check of a ``bench/ofu_clock_check.py`` folder."""
    loops = clock_check.loop_clocks(run.loops, run.samples, run.reads, sku)
    left_out = None
    try:
        ncu = clock_check.ncu_clocks(run.launches, run.kernels, run.ncu_reads) if run.launches else []
    except UsageError as exc:  # the loops still decide with the probe
        left_out, ncu = str(exc), []
    ratios = clock_check.loop_cycle_ratios(loops, ncu)
    same = clock_check.ncu_over_probe_at_the_same_clock(loops, ncu)
    rows = []
    for c in loops:
        key = (c.precision, c.m, c.n, c.k)
        rows.append(LoopRow(c, ratios.get(key), same.get(key)))
    verdict = clock_check.clock_verdict(loops, ncu, clock_check.idle_probe_over_nvml(run.loops, run.reads))
    return ClockSection(rows, ncu, left_out, verdict, sku.key,
                        dict(sku.tensor_clock_ratio) if verdict.finding == "cycles" else {})
