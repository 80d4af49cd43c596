"""The SM clock three ways over the same seconds: why the loops' FLOP/s sit at 0.9 × NVML's clock.

The GEMM sweep found, on the HMMA-pipe (GMMA) paths, the loops' executed FLOP/s equal to full-rate
math on GPM's busy fraction at 0.908 × the SM clock NVML reported (DMMA: 0.998). Either SM cycles
elapse that much slower than NVML reports (GPM right), or GPM counts more busy cycles than the
math needs (NVML right). ``bench/ofu_clock_check.py`` runs a few sweep GEMMs in steady loops
beside a one-warp probe that reads its SM's cycle counter against the GPU's timer, and once each
under Nsight Compute; this module turns its files into per-loop clocks (:func:`loop_clocks`),
per-launch ncu clocks (:func:`ncu_clocks`) and a verdict (:func:`clock_verdict`).

The answer feeds the catalog: the probe's cycle rate over NVML's clock, per GPM tensor pipe, is
``Sku.tensor_clock_ratio``, and OFU's f_ref is the peak's clock over it (``ofu/core.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelfleet.catalog import Sku
from kernelfleet.errors import UsageError
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel, tile_from_kernel_name
from kernelfleet.ofu.tiles import gemm_flops
from kernelfleet.telemetry.ncu import NcuKernel
from kernelfleet.telemetry.sample import Sample
from kernelfleet.validation.mfu import PEAK_OF, point_windows
from kernelfleet.validation.ncu import _PIPE_ACTIVE, ACTIVE_CYCLES_METRIC

# FLOPs one pipe-active SM cycle does, per SM, by precision and tensor path. Nsight Compute counted
# 4096 (bf16, fp16), 2048 (tf32), 8192 (fp8) and 256 (fp64, DMMA cycles) ops per pipe-active cycle
# on every sweep kernel of those paths (tests/replay/test_ncu_sweep.py); 4096 = 989.4 TFLOP/s /
# (132 SMs × 1830 MHz), the datasheet's own arithmetic. The CUTLASS 2.x tf32 kernels (sm80
# mma.sync on Hopper) did 4096 / 3 on all three, exactly: two thirds of the warpgroup path's rate.
FLOPS_PER_ACTIVE_CYCLE = {"bf16": 4096, "fp16": 4096, "tf32": 2048, "fp8": 8192, "fp64": 256}
MMA_SYNC_FLOPS_PER_ACTIVE_CYCLE = {"tf32": 4096 / 3}
# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*): the software power cap, and the
# hardware slowdowns (HW slowdown, HW thermal, HW power brake) that cut cycles below the set clock.
REASON_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8 | 0x40 | 0x80
# What bench/ofu_clock_check.py asks ncu for on each launch: elapsed SM cycles, the rate ncu measured
# them at, the kernel's duration and its pipe-active cycles. The 2026-11-30 run collected every one.
CLOCK_METRICS = ("sm__cycles_elapsed.avg", "sm__cycles_elapsed.avg.per_second", "sm__cycles_active.avg",
                 "gpu__time_duration.sum", _PIPE_ACTIVE, ACTIVE_CYCLES_METRIC["fp64"])
# Two clock ratios agree when they are this close; the sweep's gap (0.908) is three times as far from 1.
CLOCK_TOLERANCE = 0.03
# ncu's launch and a loop ran at one operating point when NVML read their clocks this close.
SAME_CLOCK = 0.02

Read = Sequence[Any]  # one NVML read: (wall seconds, SM clock MHz, clock-event reasons or None)


def tensor_path(precision: str, kernel: str | None) -> str:
    """The tensor path a GEMM ran: "dmma" (fp64), "gmma" (Hopper warpgroup MMA: nvjet and sm90
    kernels) or "mma.sync" (CUTLASS 2.x sm80 kernels)."""
    if precision == "fp64":
        return "dmma"
    if kernel and ("nvjet" in kernel or "sm90" in kernel):
        return "gmma"
    return "mma.sync"


def path_flops_per_active_cycle(precision: str, path: str) -> float | None:
    """FLOPs per pipe-active SM cycle of a precision on a path; None where ncu never counted it."""
    if path == "mma.sync":
        return MMA_SYNC_FLOPS_PER_ACTIVE_CYCLE.get(precision)
    return FLOPS_PER_ACTIVE_CYCLE.get(precision)


def nvml_mean_hertz(reads: Sequence[Read], start: float, end: float) -> float | None:
    """Mean of the NVML SM-clock reads taken in [start, end], in hertz (reads are evenly spaced)."""
    inside = [r[1] for r in reads if start <= r[0] <= end]
    return statistics.mean(inside) * 1e6 if inside else None


def reason_share(reads: Sequence[Read], start: float, end: float, mask: int) -> float | None:
    """Share of the reads in [start, end] that read clock-event reasons and had a bit of ``mask`` set."""
    reasons = [r[2] for r in reads if start <= r[0] <= end and len(r) > 2 and r[2] is not None]
    return sum(bool(x & mask) for x in reasons) / len(reasons) if reasons else None


def probe_clock_hertz(probe: Mapping[str, Any] | None, start: float, end: float) -> float | None:
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


def probe_covers(probe: Mapping[str, Any] | None, start: float, end: float) -> bool:
    """Whether the probe's samples span all of [start, end] in wall time (a window it only partly
    covered would set a part's cycle rate against the whole window's NVML clock)."""
    if not probe or not probe.get("samples"):
        return False
    first, last = probe["samples"][0][0], probe["samples"][-1][0]
    return probe["launch_wall"] <= start and probe["launch_wall"] + (last - first) / 1e9 >= end


@dataclass(frozen=True, slots=True)
class LoopClock:
    """One steady GEMM loop: its FLOP/s, GPM's tensor activity, NVML's SM clock and the SM cycles a
    probe counted, over the same counter windows.

    ``true_over_nvml`` is the cycle rate the loop's FLOP/s need at GPM's busy fraction, over NVML's
    clock. If SM cycles elapse slower than NVML reports, ``probe_over_nvml`` equals it and GPM is
    right (``gpm_over_math`` 1); if GPM over-counts, the probe reads NVML's clock and ``gpm_over_math``
    is 1 / ``true_over_nvml``. The probe may cover fewer windows than the loop (a loop whose GEMMs
    outlast the probe's budget); its ratio is over the windows it covers whole (``probe_windows``).
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
    probe_windows: int = 0
    probe_nvml_sm_clock_hertz: float | None = None  # NVML's clock over the probe's windows
    filler_launches: int = 0  # adds of a third of a GEMM's time after each GEMM (``ofu_clock_check.py duty``)

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
        if self.probe_sm_clock_hertz is None or not self.probe_nvml_sm_clock_hertz:
            return None
        return self.probe_sm_clock_hertz / self.probe_nvml_sm_clock_hertz

    @property
    def gpm_over_math(self) -> float | None:
        """GPM's busy fraction over the fraction the math needs at the probe's cycle rate (1: GPM right)."""
        probe = self.probe_over_nvml
        return None if probe is None else probe / self.true_over_nvml


def loop_clocks(loops: Iterable[Mapping[str, Any]], samples: Sequence[Sample], reads: Sequence[Read],
                sku: Sku) -> list[LoopClock]:
    """Every GEMM loop of a clock-check run that has whole counter windows inside its timed run.

    ``loops`` are the lines of ``clock-loop.jsonl.gz`` (a sweep point's fields, its kernels and CUDA-event
    timeline, and the probe's samples); ``samples`` the counter windows recorded alongside; ``reads`` the
    1-ms NVML clock reads. Lines of the idle baseline, of a failed point, or of a path whose FLOPs per
    active cycle were never counted are skipped.
    """
    out = []
    for p in loops:
        if p.get("idle") or "error" in p:
            continue
        kernel = next((name for name in p["kernels"] if tile_from_kernel_name(name)), None)
        m, n, k = p["m"], p["n"], p["k"]
        path = tensor_path(p["precision"], kernel)
        executed = executed_flops_of_kernel(m, n, k, kernel) if kernel else None
        peak = sku.peak_flops(PEAK_OF[p["precision"]])
        rate = path_flops_per_active_cycle(p["precision"], path)
        rows = []
        for s, mfu, _ in point_windows(p, samples, sku):
            start, end = s.timestamp_seconds - s.window_seconds, s.timestamp_seconds
            nvml = nvml_mean_hertz(reads, start, end) or s.sm_clock_mean_hertz
            if nvml is None or not s.tensor_active_ratio:
                continue
            cycles = probe_clock_hertz(p.get("probe"), start, end) if probe_covers(p.get("probe"), start, end) else None
            rows.append((mfu, s.tensor_active_ratio, nvml, cycles, start, end))
        if not rows or executed is None or peak is None or rate is None:
            continue
        mfu = statistics.mean(r[0] for r in rows)
        probed = [r for r in rows if r[3] is not None]
        first, last = rows[0][4], rows[-1][5]
        out.append(LoopClock(
            p["precision"], m, n, k, kernel, path, len(rows), mfu,
            mfu * peak * executed / gemm_flops(m, n, k), statistics.mean(r[1] for r in rows),
            statistics.mean(r[2] for r in rows), statistics.mean(r[3] for r in probed) if probed else None,
            gemm_flops(m, n, k) / (mfu * peak), rate, sku.sm_count,
            reason_share(reads, first, last, REASON_POWER_CAP), reason_share(reads, first, last, REASON_HW_SLOWDOWN),
            len(probed), statistics.mean(r[2] for r in probed) if probed else None, p.get("filler_launches", 0),
        ))
    return out


def idle_probe_over_nvml(loops: Iterable[Mapping[str, Any]], reads: Sequence[Read]) -> float | None:
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


# --- Nsight Compute's elapsed-cycle clock beside NVML's ------------------------------------------


@dataclass(frozen=True, slots=True)
class NcuClock:
    """One launch under ncu: the SM cycles it took, the rate ncu counted them at, and NVML's SM clock
    read every millisecond by another process from just before the launch until it returned."""

    precision: str
    m: int
    n: int
    k: int
    kernel: str
    path: str  # tensor_path()
    duration_seconds: float
    elapsed_cycles: float  # sm__cycles_elapsed.avg: per SM
    ncu_sm_clock_hertz: float  # sm__cycles_elapsed.avg.per_second
    nvml_sm_clock_hertz: float | None  # mean of the reads inside the launch (None: no read)
    nvml_min_hertz: float | None
    nvml_reads: int

    @property
    def ncu_over_nvml(self) -> float | None:
        return None if self.nvml_sm_clock_hertz is None else self.ncu_sm_clock_hertz / self.nvml_sm_clock_hertz


def ncu_clocks(launches: Sequence[Mapping[str, Any]], kernels: Sequence[NcuKernel],
               reads: Sequence[Read]) -> list[NcuClock]:
    """Pair each launch of the clock check's ncu run (``ncu-clock-launches.jsonl``: point, host wall
    time ``before`` and ``after``) with its profiled kernel, in order, and with the NVML reads inside it.

    Each launch runs one GEMM kernel that ncu's filter matches, so the n-th kernel is the n-th launch;
    a different count means the filter missed or added kernels, and nothing is paired.
    """
    if len(launches) != len(kernels):
        raise UsageError(f"{len(launches)} launches but ncu profiled {len(kernels)} kernels: "
                         "the filter in bench/ofu_clock_check.py missed or added some")
    out = []
    for launch, kernel in zip(launches, kernels):
        got = kernel.metrics
        elapsed, clock = got.get("sm__cycles_elapsed.avg"), got.get("sm__cycles_elapsed.avg.per_second")
        duration = got.get("gpu__time_duration.sum")  # nanoseconds, as the sweep's CSV gave it
        if elapsed is None or clock is None or duration is None:
            raise UsageError(f"{kernel.name}: the CSV lacks elapsed SM cycles or the duration")
        inside = [r[1] * 1e6 for r in reads if launch["before"] <= r[0] <= launch["after"]]
        out.append(NcuClock(
            launch["precision"], launch["m"], launch["n"], launch["k"], kernel.name,
            tensor_path(launch["precision"], kernel.name), duration / 1e9, elapsed, clock,
            statistics.mean(inside) if inside else None, min(inside, default=None), len(inside),
        ))
    return out


def _key(c: LoopClock | NcuClock) -> tuple[str, int, int, int]:
    return c.precision, c.m, c.n, c.k


def loop_cycle_ratios(loops: Sequence[LoopClock], ncu: Sequence[NcuClock]) -> dict[tuple[str, int, int, int], float]:
    """Per loop point, (ncu's elapsed SM cycles per kernel / the kernel's time in the loop) / NVML's clock
    in the loop: the cycle rate of the GEMM's own SMs in the loop, if a kernel takes as many cycles in the
    loop as alone (true of compute-bound GEMMs to within their memory stalls, ramp and tail)."""
    cycles: dict[tuple[str, int, int, int], list[float]] = {}
    for c in ncu:
        cycles.setdefault(_key(c), []).append(c.elapsed_cycles)
    return {key: statistics.median(cycles[key]) / loop.kernel_seconds / loop.nvml_sm_clock_hertz
            for loop in loops if (key := _key(loop)) in cycles}


def ncu_over_probe_at_the_same_clock(loops: Sequence[LoopClock], ncu: Sequence[NcuClock]) -> dict[tuple[str, int, int, int], float]:
    """Per loop point that ncu profiled at the loop's own operating point (NVML's clock within
    :data:`SAME_CLOCK` of the loop's), ncu's elapsed-cycle clock over NVML's, over the probe's ratio in
    the loop: 1 where the two cycle counts agree."""
    out = {}
    for loop in loops:
        probe = loop.probe_over_nvml
        same = [c.ncu_over_nvml for c in ncu if _key(c) == _key(loop) and c.ncu_over_nvml is not None
                and c.nvml_sm_clock_hertz is not None
                and abs(c.nvml_sm_clock_hertz / loop.nvml_sm_clock_hertz - 1) <= SAME_CLOCK]
        if probe is not None and same:
            out[_key(loop)] = statistics.median(same) / probe
    return out


@dataclass(frozen=True, slots=True)
class ClockVerdict:
    """What the clock check says about the sweep's gap (medians over the GMMA loops, unless named)."""

    finding: str  # "cycles" | "gpm" | "mixed" | "not-reproduced" | "uncalibrated" | "undecided"
    true_over_nvml: float | None  # f_true / f_nvml, as the sweep measured it
    probe_over_nvml: float | None  # SM cycles the probe counted / NVML's clock
    gpm_over_math: float | None  # GPM's busy fraction / the fraction the math needs at the probe's rate
    loop_cycles_over_nvml: float | None  # ncu's cycles per kernel / its time in the loop / NVML's clock
    ncu_over_nvml: float | None  # ncu's own elapsed-cycle rate / NVML's clock during the launch
    idle_probe_over_nvml: float | None  # the probe alone, no GEMM
    dmma_true_over_nvml: float | None
    dmma_probe_over_nvml: float | None
    ncu_over_probe: float | None = None  # ncu / probe where ncu ran at the loop's own NVML clock
    decided_by: str | None = None  # "probe" or "ncu" (ncu only where no probe ran)

    def describe(self) -> str:
        f = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
        numbers = (f"f_true/f_nvml {f(self.true_over_nvml)}, probe/NVML {f(self.probe_over_nvml)}, "
                   f"GPM/math {f(self.gpm_over_math)}; probe alone {f(self.idle_probe_over_nvml)}; "
                   f"DMMA f_true/f_nvml {f(self.dmma_true_over_nvml)}, probe/NVML {f(self.dmma_probe_over_nvml)}; "
                   f"secondary, Nsight Compute: ncu cycles per kernel in the loop/NVML {f(self.loop_cycles_over_nvml)}, "
                   f"isolated launches {f(self.ncu_over_nvml)}, ncu/probe at the loop's own clock "
                   f"{f(self.ncu_over_probe)}")
        return {
            "cycles": "SM cycles elapse slower than NVML reports during GMMA work; GPM's busy fraction is right",
            "gpm": "SM cycles elapse at NVML's clock; GPM counts more busy cycles than the math needs",
            "mixed": "the cycle measurement lies between the two explanations",
            "not-reproduced": "this run's loops do full-rate math on GPM's busy fraction at NVML's clock: no gap",
            "uncalibrated": "the probe alone does not read NVML's clock, so its reading under the GEMMs decides nothing",
            "undecided": "no cycle measurement (probe or ncu) to decide with",
        }[self.finding] + f" ({numbers})"


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _decide(true: float, measured: float) -> str:
    if abs(measured - true) <= CLOCK_TOLERANCE:
        return "cycles"
    return "gpm" if abs(measured - 1) <= CLOCK_TOLERANCE else "mixed"


def clock_verdict(loops: Sequence[LoopClock], ncu: Sequence[NcuClock] = (),
                  idle_probe: float | None = None) -> ClockVerdict:
    """Which of the two explanations of the gap the measurements support.

    With T = f_true / f_nvml on the GMMA loops, a cycle measurement equal to T (within
    :data:`CLOCK_TOLERANCE`) means "cycles" (the SM clock is slower than NVML says, GPM is right),
    one equal to 1 means "gpm" (NVML's clock is right, GPM over-counts busy cycles).

    The probe decides. It counts the cycles of an SM inside the very windows GPM and NVML measured,
    at the loop's own operating point, without touching the GEMMs; and the probe alone (no GEMM) is
    its calibration: there it must read NVML's clock, else its reading under load decides nothing
    ("uncalibrated"). Nsight Compute's figures are secondary, reported beside it. They measure
    another state: one launch at a time, serialised and replayed by the profiler, at the clock the
    GPU runs with nothing before it (NVML read 1980 MHz throughout the H200 run, no power cap),
    so large kernels there meet a load step the steady loops never do; and "ncu cycles per kernel
    over the kernel's time in the loop" holds only if a kernel takes as many cycles alone as in the
    loop, which ramp, tail and memory stalls at another clock break. Where ncu did run at the loop's
    own NVML clock (short kernels at 1980 MHz) its elapsed-cycle clock is compared with the probe's
    (``ncu_over_probe``). ncu decides only when no probe ran.
    """
    gmma = [c for c in loops if c.path == "gmma"]
    dmma = [c for c in loops if c.path == "dmma"]
    true = _median(c.true_over_nvml for c in gmma)
    probe = _median(c.probe_over_nvml for c in gmma)
    cycles = _median(loop_cycle_ratios(gmma, ncu).values())
    long = [c.ncu_over_nvml for c in ncu if c.path == "gmma" and c.duration_seconds >= 1e-4]
    decided_by = None
    if true is None:
        finding = "undecided"
    elif abs(true - 1) < 2 * CLOCK_TOLERANCE:
        finding = "not-reproduced"
    elif probe is not None and idle_probe is not None and abs(idle_probe - 1) > CLOCK_TOLERANCE:
        finding = "uncalibrated"
    elif probe is not None:
        finding, decided_by = _decide(true, probe), "probe"
    elif cycles is not None:
        finding, decided_by = _decide(true, cycles), "ncu"
    else:
        finding = "undecided"
    return ClockVerdict(finding, true, probe, _median(c.gpm_over_math for c in gmma), cycles, _median(long),
                        idle_probe, _median(c.true_over_nvml for c in dmma), _median(c.probe_over_nvml for c in dmma),
                        _median(ncu_over_probe_at_the_same_clock(loops, ncu).values()), decided_by)
