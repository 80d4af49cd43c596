"""Nsight Compute on every GEMM of the H200 OFU sweep (bench/ncu_sweep.sh, tests/data/h200-sweep).

One launch per point under ``ncu --clock-control none``. The first run (ncu-sweep.csv.gz) profiled
57 of the 60 kernels and counted no fp8 or fp64 ops; the re-run of the tf32, fp8 and fp64 points
(ncu-rerun.csv.gz) profiled the three CUTLASS 2.x tf32 kernels it had missed and counted fp8 and fp64
ops. The counts are checked against the kernel-name model (ofu/kernel_tiles.py: tile padding, grid
rounded to whole thread-block clusters), and the sweep's counter trace against them
(docs/validation/ofu.md, "Nsight Compute on every sweep kernel").
"""

import gzip
import json
import statistics
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.ofu import Tile
from kernelfleet.ofu.kernel_tiles import cluster_from_kernel_name, executed_flops_of_torch_mm
from kernelfleet.telemetry.ncu import names_match, parse_ncu_csv
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.validation import files, report
from kernelfleet.validation.ncu import (
    align,
    clock_checks,
    flops_per_active_cycle,
    merge_runs,
    ncu_points,
    summarize,
)

pytestmark = pytest.mark.replay
H200 = Catalog.load().get("h200-sxm")
DATA = Path(__file__).parents[1] / "data" / "h200-sweep"
FULL_RATE = {"bf16": 4096, "fp16": 4096, "tf32": 2048}  # dense FLOP/clk/SM: 989.4 TFLOP/s / 132 / 1830 MHz


KERNEL2 = "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm"  # the CUTLASS 2.x tf32 kernel (sm80 mma.sync)


def load(stem: str):
    kernels = parse_ncu_csv(gzip.decompress((DATA / f"{stem}.csv.gz").read_bytes()).decode())
    order = [json.loads(line) for line in (DATA / f"{stem}-points.jsonl").read_text().splitlines()]
    with gzip.open(DATA / "sweep-points.jsonl.gz", "rt") as f:
        sweep = [json.loads(line) for line in f]
    return kernels, order, sweep


@pytest.fixture(scope="module")
def run():
    return load("ncu-sweep")


@pytest.fixture(scope="module")
def rerun():
    return load("ncu-rerun")


@pytest.fixture(scope="module")
def points(run):
    kernels, order, sweep = run
    return ncu_points(order, sweep, kernels, H200.sm_count)


@pytest.fixture(scope="module")
def rerun_points(rerun):
    kernels, order, sweep = rerun
    return ncu_points(order, sweep, kernels, H200.sm_count)


@pytest.fixture(scope="module")
def merged(points, rerun_points):
    return merge_runs(points, rerun_points)


@pytest.fixture(scope="module")
def checks(run, merged):
    samples = [b[0] for b in ReplaySource(DATA / "sweep-trace.jsonl.gz").batches()]
    return clock_checks(run[2], samples, H200, merged)


def test_the_csv_holds_57_kernels_with_their_metrics(run):
    kernels, order, _ = run
    assert len(kernels) == 57 and len(order) == 60
    first = kernels[0]
    assert first.name == "nvjet_sm90_tst_64x8_64x16_1x2_h_bz_NNT" and first.grid == "(2, 64, 1)"
    assert first.metrics["sm__cycles_elapsed.avg"] == 7508.62  # "7,508.62" in the CSV
    assert first.metrics["sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum"] == 33_554_432


def test_alignment_by_name_skips_the_three_cutlass_tf32_kernels_ncu_did_not_match(run):
    kernels, order, sweep = run
    pairs = align(order, sweep, kernels)
    assert len(pairs) == 60 and sum(k is not None for _, k in pairs) == 57
    missing = [(p["precision"], p["m"], p["n"], p["k"]) for p, k in pairs if k is None]
    assert missing == [("tf32", 256, 256, 256), ("tf32", 512, 512, 512), ("tf32", 200, 200, 200)]
    # -k "regex:nvjet|gemm|cutlass" met the function base name "Kernel2" of these three
    by_shape = {(p["precision"], p["m"], p["n"], p["k"]): p for p in sweep}
    assert all("cutlass::Kernel2<cutlass_80_tensorop_s1688gemm" in by_shape[m]["kernels"][0] for m in missing)


def test_alignment_refuses_kernels_left_over(run):
    kernels, order, sweep = run
    with pytest.raises(UsageError, match="match no sweep point"):
        align(order[:10], sweep, kernels)


def test_names_match_across_void_truncation_and_parameter_spelling():
    assert names_match("void cutlass::Kernel2<x>(x::Params)", "cutlass::Kernel2<x>(x::Params)")
    assert names_match("void cutlass::Kernel2<x>(x::Params)", "Kernel2")
    # ncu 2025.3 writes a template's parameter type as T1 where the profiler trace spelled it out
    assert names_match("void cutlass::Kernel2<x>(x::Params)", "void cutlass::Kernel2<x>(T1::Params)")
    assert not names_match("void cutlass::Kernel2<x>(x::Params)", "void cutlass::Kernel2<y>(T1::Params)")
    assert not names_match("nvjet_sm90_tst_64x8_64x16_1x2_h_bz_NNT", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")


# The tile padding alone misses the counted ops on four nvjet kernels: a cluster launches all its
# CTAs, so the grid is rounded up to whole clusters (ofu/kernel_tiles.py rounds it).
CLUSTER_ROUNDED = {
    # nvjet 64x48 tile, 2x4 cluster: ceil(512/48) = 11 tiles along torch M, launched as 12
    ("bf16", 512, 512, 512), ("fp16", 512, 512, 512),
    # nvjet 64x8 tile, 2x4 cluster: ceil(200/8) = 25 tiles, launched as 28
    ("bf16", 200, 200, 200), ("fp16", 200, 200, 200),
}
# sm90_xmma 128x256x32, no cluster in the name: ceil(8200/128) = 65 tiles along torch N, but the
# counted ops are those of 66 (an even count, as a 2x1 cluster would give).
TF32_8200 = ("tf32", 8200, 8200, 8200)


def test_executed_tensor_ops_equal_the_name_model_on_every_nvjet_kernel(points):
    gemms = [p for p in points if p.precision in FULL_RATE]
    assert len(gemms) == 42 and all(p.executed_ops is not None for p in gemms)
    nvjet = [p for p in gemms if p.kernel.startswith("nvjet_")]
    assert len(nvjet) == 30 and all(p.executed_ops == p.name_executed_flops for p in nvjet)  # exact, to the op
    assert {(p.precision, p.m, p.n, p.k) for p in gemms if not p.ops_equal_name} == {TF32_8200}
    # without the rounding to whole clusters, the four kernels above would miss
    assert {(p.precision, p.m, p.n, p.k) for p in gemms if p.executed_ops != p.tile_executed_flops} == (
        CLUSTER_ROUNDED | {TF32_8200})
    (tf32,) = [p for p in gemms if (p.precision, p.m, p.n, p.k) == TF32_8200]
    assert tf32.executed_ops * 65 == tf32.name_executed_flops * 66
    assert tf32.executed_ops == 2 * (66 * 128) * (33 * 256) * 8224


def test_the_cluster_runs_along_the_tiles_sides_not_across_them(merged):
    """The cluster's first side goes with the tile's first (cuBLAS M = torch N). Swapping the two
    misses the counted ops on every kernel where the assignment makes a difference."""
    differ = 0
    for p in merged:
        cluster = cluster_from_kernel_name(p.kernel)
        if p.executed_ops is None or cluster is None:
            continue
        swapped = Tile(p.tile.m * cluster[1], p.tile.n * cluster[0], p.tile.k)
        other = executed_flops_of_torch_mm(p.m, p.n, p.k, swapped)
        if other != p.name_executed_flops:
            differ += 1
            assert other != p.executed_ops
    # 200^3 and 8200^3 bf16/fp16, 4096x14336x4096 bf16/fp16, 1000^3 fp16 (4x2); five fp8 kernels (re-run)
    assert differ == 12


def test_every_pipe_active_cycle_does_full_rate_math(points):
    for p in points:
        if p.precision in FULL_RATE:
            assert p.flops_per_active_cycle(H200.sm_count) == pytest.approx(FULL_RATE[p.precision], rel=1e-3)
    # small, short-K and large kernels alike: the pipe-active fraction spans two orders of magnitude
    active = [p.active_ratio for p in points if p.precision in FULL_RATE]
    assert min(active) < 0.01 and max(active) > 0.97


def test_the_rerun_profiled_every_tf32_fp8_and_fp64_point(rerun, points, rerun_points, merged):
    kernels, order, sweep = rerun
    assert len(kernels) == len(order) == 30 and len(rerun_points) == 30
    assert list(dict.fromkeys(p["precision"] for p in order)) == ["tf32", "fp8", "fp64"]
    assert len(merged) == 60  # with the first run's bf16 and fp16: every sweep point profiled
    # where both runs counted ops (the twelve sm90 tf32 kernels) they counted the same, to the op
    first = {(p.precision, p.m, p.n, p.k): p.executed_ops for p in points if p.precision == "tf32"}
    again = {(p.precision, p.m, p.n, p.k): p.executed_ops for p in rerun_points if (p.precision, p.m, p.n, p.k) in first}
    assert len(again) == 12 and again == first


def test_the_cutlass_2x_tf32_kernels_do_two_thirds_of_the_warpgroup_rate(rerun_points):
    """sm80 mma.sync kernels on Hopper: every pipe-active cycle does 4096 / 3 tf32 FLOPs per SM, two
    thirds of the 2048 the sm90 warpgroup kernels do."""
    kernel2 = [p for p in rerun_points if p.kernel.startswith("void " + KERNEL2)]
    assert [(p.m, p.n, p.k) for p in kernel2] == [(256, 256, 256), (512, 512, 512), (200, 200, 200)]
    assert all(p.executed_ops == p.name_executed_flops for p in kernel2)  # tile 64x64x32, read from the name
    assert all(p.flops_per_active_cycle(H200.sm_count) == pytest.approx(4096 / 3, rel=1e-9) for p in kernel2)
    sm90 = [p for p in rerun_points if p.precision == "tf32" and p not in kernel2]
    assert len(sm90) == 12 and all(p.flops_per_active_cycle(H200.sm_count) == 2048 for p in sm90)


def test_the_rerun_counts_fp8_and_fp64_ops_and_they_equal_the_name_model(rerun_points):
    for q, rate, tile_only in (("fp8", 8192, 9), ("fp64", 256, 4)):
        mine = [p for p in rerun_points if p.precision == q]
        assert mine and all(p.executed_ops == p.name_executed_flops for p in mine), q  # exact, to the op
        assert sum(p.executed_ops == p.tile_executed_flops for p in mine) == tile_only, q
        assert all(p.flops_per_active_cycle(H200.sm_count) == pytest.approx(rate, rel=1e-9) for p in mine), q
        assert flops_per_active_cycle(rerun_points, q, H200.sm_count) == (rate, "counted")


def test_fp8_and_fp64_ops_were_not_counted_but_the_name_model_gives_a_constant_rate(points):
    # No fp8/fp64 ops-path counter in the first run; the name model (tile and cluster) over counted
    # pipe-active (fp64: DMMA) cycles gives 8192 and 256 FLOP/clk/SM on every kernel.
    for q, rate in (("fp8", 8192), ("fp64", 256)):
        mine = [p for p in points if p.precision == q]
        assert mine and all(p.executed_ops is None and p.ops_equal_name is None for p in mine)
        assert all(p.derived_flops_per_active_cycle(H200.sm_count) == pytest.approx(rate, rel=1e-9) for p in mine)
        assert flops_per_active_cycle(points, q, H200.sm_count) == (rate, "derived")


def test_the_loop_needed_fewer_sm_cycles_than_nvml_reported_for_gmma_but_not_for_dmma(checks):
    """f_true = executed FLOP/s / (GPM activity x 132 x FLOP per active cycle), against NVML's clock;
    each kernel at its own counted rate (the CUTLASS 2.x tf32 ones at 4096 / 3)."""
    assert len(checks) == 60
    for q in ("bf16", "fp16", "tf32", "fp8"):
        ratios = [c.clock_ratio for c in checks if c.precision == q]
        assert 0.90 < statistics.median(ratios) < 0.915, q
        assert all(0.88 < r < 0.96 for r in ratios), q
    fp64 = [c.clock_ratio for c in checks if c.precision == "fp64"]
    assert all(0.99 < r < 1.005 for r in fp64)  # DMMA: NVML's clock is the cycle rate, at 1570-1820 MHz


def test_the_gap_is_not_a_power_cap_effect(checks):
    """At 1980 MHz (small GEMMs, no cap) the GMMA ratio is as low as at 1240-1600 MHz under the cap."""
    gmma = [c for c in checks if c.precision != "fp64"]
    uncapped = [c.clock_ratio for c in gmma if c.nvml_sm_clock_hertz > 1.9e9]
    capped = [c.clock_ratio for c in gmma if c.nvml_sm_clock_hertz < 1.6e9]
    assert len(uncapped) >= 12 and len(capped) >= 30
    assert statistics.median(uncapped) < 0.915 and statistics.median(capped) < 0.915
    assert abs(statistics.median(uncapped) - statistics.median(capped)) < 0.015


def test_gpm_activity_in_the_loop_equals_ncus_pipe_active_fraction_on_busy_kernels(checks):
    busy = [c for c in checks if c.ncu_active_ratio >= 0.9]
    assert len(busy) >= 20
    assert all(abs(c.gpm_tensor_active_ratio - c.ncu_active_ratio) < 0.015 for c in busy)
    # a 9 % gap in activity would be 0.08 at these levels: the ratio above is not an activity gap
    assert statistics.mean(c.gpm_tensor_active_ratio - c.ncu_active_ratio for c in busy) < 0.005


def test_summary_per_precision(merged, checks):
    rows = {s.precision: s for s in summarize(merged, checks, H200.sm_count)}
    assert {q: (s.profiled, s.ops_counted, s.ops_equal_name, s.ops_equal_tile_only) for q, s in rows.items()} == {
        "bf16": (15, 15, 15, 13), "fp16": (15, 15, 15, 13), "tf32": (15, 15, 14, 14),
        "fp8": (11, 11, 11, 9), "fp64": (4, 4, 4, 4),
    }
    assert rows["bf16"].flops_per_active_cycle == 4096 and rows["bf16"].rate_basis == "counted"
    assert {q: s.rate_basis for q, s in rows.items()} == dict.fromkeys(rows, "counted")
    assert rows["bf16"].mean_clock_ratio == pytest.approx(0.9086, abs=1e-4)
    assert rows["tf32"].mean_clock_ratio == pytest.approx(0.9125, abs=1e-4)  # Kernel2 at 4096 / 3 included
    assert rows["fp64"].mean_clock_ratio == pytest.approx(0.9981, abs=1e-4)
    # the tile correction with counted ops is Table II's where its model equals the counts (bf16 0.66 pp)
    assert rows["bf16"].corrected_mae_pp == pytest.approx(0.657, abs=1e-3)


def test_the_reports_ncu_section_reads_both_runs_of_the_folder():
    """``bench ofu-report --ncu``'s rows, from the files as the report finds them (Table II's beside it
    are in test_h200_recordings.py)."""
    sweep = files.read_sweep(DATA)
    section = report.ncu_section(files.read_ncu_runs(DATA), sweep, H200)
    assert (section.runs, section.sweep_points, len(section.profiled), len(section.kernels)) == (2, 60, 60, 60)
    rows = {s.precision: s for s in section.summaries}
    assert {q: (s.profiled, s.ops_equal_name, s.ops_counted, s.ops_equal_tile_only, s.flops_per_active_cycle,
                s.rate_basis) for q, s in rows.items() if q in ("bf16", "tf32", "fp8")} == {
        "bf16": (15, 15, 15, 13, 4096, "counted"), "tf32": (15, 14, 15, 14, 2048, "counted"),
        "fp8": (11, 11, 11, 9, 8192, "counted")}
    # every kernel row pairs a sweep point's implied clock with the same shape's profiled kernel
    assert all((k.check.precision, k.check.m, k.check.n, k.check.k) == (k.profiled.precision, k.profiled.m,
                                                                          k.profiled.n, k.profiled.k) for k in section.kernels)
