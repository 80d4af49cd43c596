"""Nsight Compute counts for the OFU sweep's GEMMs, against the name model and the counter trace.

``bench/ncu_sweep.sh`` profiles one launch of every sweep GEMM (``ncu --csv``, clocks not
locked). This module aligns that CSV's kernels (read by ``telemetry/ncu.py``) to the sweep points
by name, and asks three questions of each point:

* Does the tensor pipe execute the FLOPs the kernel name predicts (``ofu/kernel_tiles.py``:
  tile padding, grid rounded to whole clusters)? The ops-path counters count every math op
  the pipe executed, padded tiles included.
* How many FLOPs does one pipe-active SM cycle do? If the answer is the full rate on every
  kernel (4096 bf16/fp16, 2048 tf32 per SM), no busy tensor cycle is an idle one.
* What SM clock would the loop have needed? ``executed FLOP/s / (GPM tensor activity ×
  SMs × FLOPs per active cycle)`` is the rate at which SM cycles must have elapsed in the
  sweep; it is compared with the SM clock NVML reported over the same windows.

Why that clock is 0.908 × NVML's on the GMMA paths is the clock check's question
(``validation/clock_check.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelfleet.catalog import Sku
from kernelfleet.errors import UsageError
from kernelfleet.ofu.kernel_tiles import (
    executed_flops_of_kernel,
    executed_flops_of_torch_mm,
    tile_from_kernel_name,
)
from kernelfleet.ofu.tiles import Tile, corrected_ofu, gemm_flops
from kernelfleet.telemetry.ncu import SUB_PARTITIONS_PER_SM, NcuKernel, names_match
from kernelfleet.telemetry.sample import Sample
from kernelfleet.validation.mfu import PEAK_OF, point_windows

# The ops-path counters, without the _sparsity_on/_off split, whose sum is the executed math
# ops of a precision: the warpgroup path (HGMMA) and the warp path (HMMA, e.g. CUTLASS 2.x
# kernels). fp8 and fp64 use ncu's per-source totals; the first 2026-11-30 run did not collect
# them, the re-run did (ncu 2025.3.1 lists both on gh100; tests/data/h200-sweep/ncu-rerun.csv.gz).
OPS_METRICS = {
    "bf16": ("sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32.sum"),
    "fp16": ("sm__ops_path_tensor_op_hgmma_src_fp16.sum", "sm__ops_path_tensor_op_hmma_src_fp16.sum"),
    "tf32": ("sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32.sum", "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum"),
    "fp8": ("sm__ops_path_tensor_src_fp8.sum",),
    "fp64": ("sm__ops_path_tensor_src_fp64.sum",),
}
# Where a chip lists the fp8 total only split by destination type (NVIDIA's listings for other chips
# spell sm__ops_path_tensor_src_fp8_dst_fp16 and _dst_fp32), the split parts add up to it; they are
# summed only when the plain total is absent, so a run that collected both does not count twice.
OPS_SPLIT_METRICS = {
    "fp8": ("sm__ops_path_tensor_src_fp8_dst_fp16.sum", "sm__ops_path_tensor_src_fp8_dst_fp32.sum"),
}
# The pipe-active cycles a precision's math runs in: fp64 runs on the DMMA sub-pipe.
ACTIVE_CYCLES_METRIC = {"fp64": "sm__pipe_tensor_op_dmma_cycles_active.sum"}
_PIPE_ACTIVE = "sm__pipe_tensor_cycles_active.sum"


def gemm_kernel(point: Mapping[str, Any]) -> str | None:
    """The GEMM kernel a sweep point ran: its kernel that is not a memset."""
    return next((name for name in point.get("kernels", []) if "Memset" not in name), None)


def align(order: Sequence[Mapping[str, Any]], sweep_points: Sequence[Mapping[str, Any]],
          kernels: Sequence[NcuKernel]) -> list[tuple[Mapping[str, Any], NcuKernel | None]]:
    """Pair every point of the ncu run (``order``, in launch order) with its profiled kernel or None.

    ncu may skip a kernel its filter did not match, so the n-th kernel is not the n-th point:
    the next kernel belongs to a point only if its name matches the GEMM kernel the sweep
    recorded for that (M, N, K, precision); otherwise the point was not profiled.
    """
    expected = {(p["m"], p["n"], p["k"], p["precision"]): gemm_kernel(p) for p in sweep_points}
    out: list[tuple[Mapping[str, Any], NcuKernel | None]] = []
    queue = list(kernels)
    for point in order:
        name = expected.get((point["m"], point["n"], point["k"], point["precision"]))
        if queue and name is not None and names_match(name, queue[0].name):
            out.append((point, queue.pop(0)))
        else:
            out.append((point, None))
    if queue:
        raise UsageError(f"{len(queue)} profiled kernels match no sweep point, first {queue[0].name!r}: "
                         "the ncu run and the sweep chose different kernels")
    return out


@dataclass(frozen=True, slots=True)
class NcuPoint:
    """One profiled sweep GEMM: what ncu counted, next to what the kernel name predicts."""

    precision: str
    m: int
    n: int
    k: int
    kernel: str
    tile: Tile | None
    executed_ops: int | None  # ncu ops-path count; None where the metric was not collected
    name_executed_flops: int | None  # ofu/kernel_tiles.py (tile and cluster), as the OFU correction uses it
    tile_executed_flops: int | None  # the tile padding alone, without rounding to whole clusters
    active_cycles_per_sm: float  # pipe-active cycles (DMMA for fp64), per SM
    elapsed_cycles_per_sm: float
    sm_clock_hertz: float  # elapsed SM cycles / kernel duration, as ncu measured it

    @property
    def ops_equal_name(self) -> bool | None:
        if self.executed_ops is None or self.name_executed_flops is None:
            return None
        return self.executed_ops == self.name_executed_flops

    @property
    def active_ratio(self) -> float:
        """Fraction of the kernel's elapsed SM cycles in which the tensor pipe was busy."""
        return self.active_cycles_per_sm / self.elapsed_cycles_per_sm

    def flops_per_active_cycle(self, sm_count: int) -> float | None:
        """Counted executed ops per pipe-active cycle per SM (None without the ops counter)."""
        if self.executed_ops is None or not self.active_cycles_per_sm:
            return None
        return self.executed_ops / sm_count / self.active_cycles_per_sm

    def derived_flops_per_active_cycle(self, sm_count: int) -> float | None:
        """The same from the name model, for precisions whose ops were not counted."""
        if self.name_executed_flops is None or not self.active_cycles_per_sm:
            return None
        return self.name_executed_flops / sm_count / self.active_cycles_per_sm


def executed_ops(precision: str, metrics: Mapping[str, float | None]) -> int | None:
    """The executed tensor math ops of a precision a kernel's metrics count, or None where none was collected."""
    for names in (OPS_METRICS[precision], OPS_SPLIT_METRICS.get(precision, ())):
        counted = [metrics[name] for name in names if metrics.get(name) is not None]
        if counted:
            return int(sum(counted))  # type: ignore[arg-type]
    return None


def ncu_point(point: Mapping[str, Any], kernel: NcuKernel, sm_count: int, model_name: str | None = None) -> NcuPoint:
    """The counts of one aligned (point, kernel) pair.

    ``model_name`` is the name the tile is read from when ncu's own name states none (ncu may print
    a C++ kernel's base name, ``Kernel2``, where the profiler trace kept the template arguments).
    """
    m, n, k, precision = point["m"], point["n"], point["k"], point["precision"]
    if precision not in OPS_METRICS:
        raise UsageError(f"unknown sweep precision {precision!r}; expected one of {sorted(OPS_METRICS)}")
    got = kernel.metrics
    active = got.get(ACTIVE_CYCLES_METRIC.get(precision, _PIPE_ACTIVE))
    elapsed, clock = got.get("sm__cycles_elapsed.avg"), got.get("sm__cycles_elapsed.avg.per_second")
    if active is None or elapsed is None or clock is None:
        raise UsageError(f"{kernel.name}: the CSV lacks pipe-active or elapsed SM cycles (run bench/ncu_sweep.sh)")
    name = kernel.name if tile_from_kernel_name(kernel.name) or not model_name else model_name
    tile = tile_from_kernel_name(name)
    return NcuPoint(
        precision, m, n, k, kernel.name, tile,
        executed_ops(precision, got),
        executed_flops_of_kernel(m, n, k, name),
        executed_flops_of_torch_mm(m, n, k, tile) if tile else None,
        active / (SUB_PARTITIONS_PER_SM * sm_count), elapsed, clock,
    )


def ncu_points(order: Sequence[Mapping[str, Any]], sweep_points: Sequence[Mapping[str, Any]],
               kernels: Sequence[NcuKernel], sm_count: int) -> list[NcuPoint]:
    """Every profiled point of an ncu run, in launch order."""
    expected = {(p["m"], p["n"], p["k"], p["precision"]): gemm_kernel(p) for p in sweep_points}
    return [ncu_point(p, kern, sm_count, expected.get((p["m"], p["n"], p["k"], p["precision"])))
            for p, kern in align(order, sweep_points, kernels) if kern is not None]


def merge_runs(*runs: Sequence[NcuPoint]) -> list[NcuPoint]:
    """The profiled points of several ncu runs of one sweep; a later run's point replaces an earlier
    run's point of the same shape and precision (a re-run that counts what the first could not)."""
    by_point: dict[tuple[str, int, int, int], NcuPoint] = {}
    for run in runs:
        for p in run:
            by_point[p.precision, p.m, p.n, p.k] = p
    return list(by_point.values())


def flops_per_active_cycle(points: Sequence[NcuPoint], precision: str, sm_count: int) -> tuple[float, str] | None:
    """A precision's FLOPs per pipe-active SM cycle: the median over its kernels, and its basis.

    Counted ops where ncu collected them; otherwise the name model (tile and cluster) over
    the counted active cycles ("derived"). None when no kernel of the precision was profiled.
    """
    mine = [p for p in points if p.precision == precision]
    counted = [r for p in mine if (r := p.flops_per_active_cycle(sm_count)) is not None]
    if counted:
        return statistics.median(counted), "counted"
    derived = [r for p in mine if (r := p.derived_flops_per_active_cycle(sm_count)) is not None]
    return (statistics.median(derived), "derived") if derived else None


@dataclass(frozen=True, slots=True)
class ClockCheck:
    """One sweep point: the SM clock its measured FLOP/s imply against the clock NVML reported."""

    precision: str
    m: int
    n: int
    k: int
    windows: int
    mfu_ratio: float
    raw_ofu_ratio: float
    executed_flops: int  # per GEMM: ncu-counted ops, else (fp8, fp64) the name model
    gpm_tensor_active_ratio: float  # mean over the point's windows
    nvml_sm_clock_hertz: float  # mean over the same windows
    executed_flops_per_second: float  # MFU × peak × executed / useful
    flops_per_active_cycle: float  # per SM: this kernel's counted rate, else its precision's (ncu)
    ncu_active_ratio: float  # the isolated kernel's pipe-active fraction under ncu
    sm_count: int

    @property
    def implied_sm_clock_hertz(self) -> float:
        """SM cycles per second the loop needed if GPM activity is the pipe-active fraction."""
        busy_sms = self.gpm_tensor_active_ratio * self.sm_count  # SM-equivalents with the pipe busy
        return self.executed_flops_per_second / (busy_sms * self.flops_per_active_cycle)

    @property
    def clock_ratio(self) -> float:
        """f_true / f_nvml."""
        return self.implied_sm_clock_hertz / self.nvml_sm_clock_hertz

    @property
    def corrected_error_pp(self) -> float:
        """Corrected OFU − MFU with the executed FLOPs above, in percentage points."""
        return 100 * (corrected_ofu(self.raw_ofu_ratio, gemm_flops(self.m, self.n, self.k), self.executed_flops)
                      - self.mfu_ratio)


def _windows(point: Mapping[str, Any], samples: Sequence[Sample], sku: Sku) -> list[tuple[float, float, float, float]]:
    """(MFU, raw OFU, GPM tensor activity, NVML SM clock) of each window Table II matches to the point."""
    return [(mfu, raw, s.tensor_active_ratio, s.sm_clock_mean_hertz) for s, mfu, raw in point_windows(point, samples, sku)
            if s.tensor_active_ratio is not None and s.sm_clock_mean_hertz is not None]


def clock_checks(sweep_points: Sequence[Mapping[str, Any]], samples: Sequence[Sample], sku: Sku,
                 profiled: Sequence[NcuPoint]) -> list[ClockCheck]:
    """The implied SM clock of every profiled sweep point that has windows.

    Only profiled points, each at its own kernel's counted FLOPs per active cycle where ncu counted
    its ops: kernels of one precision may run different tensor paths at different rates (the three
    CUTLASS 2.x tf32 kernels, sm80 mma.sync, do 4096/3 where the sm90 ones do 2048).
    """
    by_shape = {(p.m, p.n, p.k, p.precision): p for p in profiled}
    rates = {q: flops_per_active_cycle(profiled, q, sku.sm_count) for q in OPS_METRICS}
    out = []
    for point in sweep_points:
        m, n, k, precision = key = (point["m"], point["n"], point["k"], point["precision"])
        ncu, rate, peak = by_shape.get(key), rates.get(precision), sku.peak_flops(PEAK_OF[precision])
        if "error" in point or ncu is None or rate is None or peak is None:
            continue
        executed = ncu.executed_ops if ncu.executed_ops is not None else ncu.name_executed_flops
        windows = _windows(point, samples, sku)
        if not windows or executed is None:
            continue
        mfu, ofu, active, clock = (statistics.mean(column) for column in zip(*windows))
        out.append(ClockCheck(
            precision, m, n, k, len(windows), mfu, ofu, executed, active, clock,
            mfu * peak * executed / gemm_flops(m, n, k), ncu.flops_per_active_cycle(sku.sm_count) or rate[0],
            ncu.active_ratio, sku.sm_count,
        ))
    return out


@dataclass(frozen=True, slots=True)
class NcuSummary:
    """One precision of an ncu run, next to the sweep's counters."""

    precision: str
    profiled: int
    ops_counted: int  # kernels whose ops-path counter ncu collected
    ops_equal_name: int  # of those, counted ops == ofu/kernel_tiles.py's executed FLOPs (tile and cluster)
    ops_equal_tile_only: int  # counted ops == the tile padding alone, without whole clusters
    flops_per_active_cycle: float | None  # per SM, median over kernels
    rate_basis: str | None  # "counted" or "derived" (name model / counted active cycles)
    mean_ncu_active_ratio: float
    mean_gpm_active_ratio: float | None
    mean_clock_ratio: float | None  # f_true / f_nvml
    min_clock_ratio: float | None
    max_clock_ratio: float | None
    corrected_mae_pp: float | None  # tile correction with the executed FLOPs ncu counted


def summarize(points: Sequence[NcuPoint], checks: Sequence[ClockCheck], sm_count: int) -> list[NcuSummary]:
    """Per precision, in the order the run profiled them."""
    out = []
    for q in dict.fromkeys(p.precision for p in points):
        mine = [p for p in points if p.precision == q]
        counted = [p for p in mine if p.executed_ops is not None]
        ratios = [c.clock_ratio for c in checks if c.precision == q]
        gpm = [c.gpm_tensor_active_ratio for c in checks if c.precision == q]
        errors = [abs(c.corrected_error_pp) for c in checks if c.precision == q]
        rate = flops_per_active_cycle(points, q, sm_count)
        out.append(NcuSummary(
            q, len(mine), len(counted), sum(p.executed_ops == p.name_executed_flops for p in counted),
            sum(p.executed_ops == p.tile_executed_flops for p in counted),
            rate[0] if rate else None, rate[1] if rate else None,
            statistics.mean(p.active_ratio for p in mine), statistics.mean(gpm) if gpm else None,
            statistics.mean(ratios) if ratios else None, min(ratios, default=None), max(ratios, default=None),
            statistics.mean(errors) if errors else None,
        ))
    return out
