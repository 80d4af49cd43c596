"""OFU against measured MFU for controlled GEMMs (the paper's Table II, on our runs).

Inputs are plain data recorded on a GPU by ``kernelfleet bench ofu``: the sweep's
points (shape, precision, kernel names, CUDA-event timeline) and the counter
trace sampled alongside. For every window that lies wholly inside a point's
timed run, MFU is the FLOPs the timeline completed in the window over the
window and the precision's dense peak; raw OFU comes from the window's counters;
corrected OFU removes the padded tile work of the kernel that ran (its tile, and
its thread-block cluster where the name states one: ``ofu/kernel_tiles.py``).

The clock check (``bench/ofu_clock_check.py``) runs a few of the sweep's GEMMs in steady loops
beside a probe that counts SM cycles, and asks whether the gap the sweep left (full-rate math on
GPM's busy fraction at 0.908 × NVML's clock) is a slower SM clock or an over-counting GPM
(:func:`loop_clocks`; the verdict is ``ofu/ncu.py: clock_verdict``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from kernelfleet.catalog import Sku
from kernelfleet.ofu.core import ofu
from kernelfleet.ofu.kernel_tiles import cluster_from_kernel_name, executed_flops_of_kernel, tile_from_kernel_name
from kernelfleet.ofu.tiles import Tile, corrected_ofu, gemm_flops
from kernelfleet.ofu.timeline import work_between
from kernelfleet.telemetry.sample import Sample

# The datasheet peak each sweep precision is measured against.
PEAK_OF = {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32", "fp8": "fp8", "fp64": "fp64_tensor"}


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
        reading = ofu(s, sku)
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


# --- the clock check (bench/ofu_clock_check.py): the SM clock three ways over the same seconds -------

# FLOPs one pipe-active SM cycle does at full rate, per SM. Nsight Compute counted 4096 (bf16, fp16)
# and 2048 (tf32) ops per pipe-active cycle on every GMMA kernel of the 2026-11-30 sweep run; fp8 8192
# and fp64 256 (DMMA cycles) are the name model over counted active cycles (tests/replay/
# test_ncu_sweep.py). 4096 = 989.4 TFLOP/s / (132 SMs × 1830 MHz), the datasheet's own arithmetic.
FLOPS_PER_ACTIVE_CYCLE = {"bf16": 4096, "fp16": 4096, "tf32": 2048, "fp8": 8192, "fp64": 256}
# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*): the software power cap, and the
# hardware slowdowns (HW slowdown, HW thermal, HW power brake) that cut cycles below the set clock.
REASON_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8 | 0x40 | 0x80

Read = Sequence[Any]  # one NVML read: (wall seconds, SM clock MHz, clock-event reasons or None)


def tensor_path(precision: str, kernel: str | None) -> str:
    """The tensor path a GEMM ran: "dmma" (fp64), "gmma" (Hopper warpgroup MMA: nvjet and sm90
    kernels) or "mma.sync" (CUTLASS 2.x sm80 kernels, whose rate per active cycle was never counted)."""
    if precision == "fp64":
        return "dmma"
    if kernel and ("nvjet" in kernel or "sm90" in kernel):
        return "gmma"
    return "mma.sync"


def nvml_mean_hertz(reads: Sequence[Read], start: float, end: float) -> float | None:
    """Mean of the NVML SM-clock reads taken in [start, end], in hertz (reads are evenly spaced)."""
    inside = [r[1] for r in reads if start <= r[0] <= end]
    return statistics.mean(inside) * 1e6 if inside else None


def reason_share(reads: Sequence[Read], start: float, end: float, mask: int) -> float | None:
    """Share of the reads in [start, end] that read clock-event reasons and had a bit of ``mask`` set."""
    reasons = [r[2] for r in reads if start <= r[0] <= end and len(r) > 2 and r[2] is not None]
    return sum(bool(x & mask) for x in reasons) / len(reasons) if reasons else None


def probe_clock_hertz(probe: dict[str, Any] | None, start: float, end: float) -> float | None:
    """SM cycles per second on the probe's SM over [start, end]: ``%clock64`` ticks over ``%globaltimer``
    nanoseconds between the first and last probe sample inside the interval.

    ``probe["samples"]`` holds ``[timer_ns, clock64, bracket_ns]`` per sample (the clock read between two
    timer reads ``bracket_ns`` apart); its timer maps to wall time from ``launch_wall``, taken on the host
    just before the probe was launched on an idle GPU.
    """
    if not probe or not probe.get("samples"):
        return None
    first = probe["samples"][0][0]
    inside = [(t + d / 2, c) for t, c, d in probe["samples"]
              if start <= probe["launch_wall"] + (t + d / 2 - first) / 1e9 <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / ((inside[-1][0] - inside[0][0]) / 1e9)


@dataclass(frozen=True, slots=True)
class LoopClock:
    """One steady GEMM loop: its FLOP/s, GPM's tensor activity, NVML's SM clock and the SM cycles a
    probe counted, all over the same counter windows.

    The sweep found the loop's executed FLOP/s equal to full-rate math on GPM's busy fraction at
    0.908 × NVML's clock on the GMMA paths (``true_over_nvml``). Either SM cycles elapse slower than
    NVML reports (then ``probe_over_nvml`` is 0.908 too and GPM is right: ``gpm_over_math`` 1), or GPM
    counts more busy cycles than the math needs (then the probe reads NVML's clock and
    ``gpm_over_math`` is 1 / 0.908).
    """

    precision: str
    m: int
    n: int
    k: int
    kernel: str | None
    path: str  # tensor_path()
    windows: int
    mfu_ratio: float
    executed_flops_per_second: float  # useful FLOP/s × the kernel's executed / useful FLOPs (name model)
    gpm_tensor_active_ratio: float
    nvml_sm_clock_hertz: float  # 1-ms NVML reads inside the windows (the windows' own mean without them)
    probe_sm_clock_hertz: float | None
    kernel_seconds: float  # one GEMM's share of the loop's time
    flops_per_active_cycle: float
    sm_count: int
    power_capped_ratio: float | None = None  # share of NVML reads with the software power cap set
    hw_slowdown_ratio: float | None = None  # ... with a hardware slowdown set

    @property
    def implied_sm_clock_hertz(self) -> float:
        """f_true: the cycle rate the loop needed if GPM's activity is the pipe-active fraction."""
        busy_sms = self.gpm_tensor_active_ratio * self.sm_count
        return self.executed_flops_per_second / (busy_sms * self.flops_per_active_cycle)

    @property
    def true_over_nvml(self) -> float:
        return self.implied_sm_clock_hertz / self.nvml_sm_clock_hertz

    @property
    def probe_over_nvml(self) -> float | None:
        return None if self.probe_sm_clock_hertz is None else self.probe_sm_clock_hertz / self.nvml_sm_clock_hertz

    @property
    def gpm_over_math(self) -> float | None:
        """GPM's busy fraction over the fraction the math needs at the probe's cycle rate (1: GPM right)."""
        return None if self.probe_sm_clock_hertz is None else self.probe_sm_clock_hertz / self.implied_sm_clock_hertz


def loop_clocks(loops: Iterable[dict[str, Any]], samples: Sequence[Sample], reads: Sequence[Read],
                sku: Sku) -> list[LoopClock]:
    """Every GEMM loop of a clock-check run that has whole counter windows inside its timed run.

    ``loops`` are the lines of ``clock-loop.jsonl.gz`` (a sweep point's fields, its kernels and CUDA-event
    timeline, and the probe's samples); ``samples`` the counter windows recorded alongside; ``reads`` the
    1-ms NVML clock reads. Lines of the idle baseline or of a failed point are skipped.
    """
    out = []
    for p in loops:
        if p.get("idle") or "error" in p:
            continue
        kernel = next((name for name in p["kernels"] if tile_from_kernel_name(name)), None)
        m, n, k = p["m"], p["n"], p["k"]
        executed = executed_flops_of_kernel(m, n, k, kernel) if kernel else None
        peak = sku.peak_flops(PEAK_OF[p["precision"]])
        rows = []
        for s, mfu, _ in point_windows(p, samples, sku):
            start, end = s.timestamp_seconds - s.window_seconds, s.timestamp_seconds
            nvml = nvml_mean_hertz(reads, start, end) or s.sm_clock_mean_hertz
            if nvml is None or not s.tensor_active_ratio:
                continue
            rows.append((mfu, s.tensor_active_ratio, nvml, probe_clock_hertz(p.get("probe"), start, end), start, end))
        if not rows or executed is None or peak is None:
            continue
        mfu = statistics.mean(r[0] for r in rows)
        probes = [r[3] for r in rows]
        first, last = rows[0][4], rows[-1][5]
        out.append(LoopClock(
            p["precision"], m, n, k, kernel, tensor_path(p["precision"], kernel), len(rows), mfu,
            mfu * peak * executed / gemm_flops(m, n, k), statistics.mean(r[1] for r in rows),
            statistics.mean(r[2] for r in rows), None if None in probes else statistics.mean(probes),  # type: ignore[arg-type]
            gemm_flops(m, n, k) / (mfu * peak), FLOPS_PER_ACTIVE_CYCLE[p["precision"]], sku.sm_count,
            reason_share(reads, first, last, REASON_POWER_CAP), reason_share(reads, first, last, REASON_HW_SLOWDOWN),
        ))
    return out


def idle_probe_over_nvml(loops: Iterable[dict[str, Any]], reads: Sequence[Read]) -> float | None:
    """The probe's cycle rate over NVML's clock with no GEMM running (median over the idle runs): 1 if
    the probe counts the cycles NVML's clock implies, so that a GEMM loop's ratio is the GEMMs' doing."""
    ratios = []
    for p in loops:
        if p.get("idle"):
            start, end = p["start_wall"], p["end_wall"]
            probe, nvml = probe_clock_hertz(p.get("probe"), start, end), nvml_mean_hertz(reads, start, end)
            if probe is not None and nvml:
                ratios.append(probe / nvml)
    return statistics.median(ratios) if ratios else None
