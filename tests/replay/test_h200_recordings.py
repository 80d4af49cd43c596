"""Replay tests on what an H200 produced (tests/data/h200, recorded by bench/record_traces.py).

Exact values are asserted where the recording fixes them; the calibration tests
recompute OFU and MFU window by window from the recorded counters and the
loops' CUDA-event timelines.
"""

import csv
import gzip
import json
import statistics
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.ofu import Bottleneck, classify, ofu
from kernelfleet.ofu.aggregate import by_gpu, fleet, resample, summarize
from kernelfleet.ofu.core import ofu_ratio
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.validation import files, report
from kernelfleet.validation.mfu import gemm_points, summarize_errors
from kernelfleet.validation.sampling import clock_sampling_errors, instant_clock_errors_pp
from kernelfleet.validation.timeline import work_between as timeline_work

pytestmark = pytest.mark.replay
H200 = Catalog.load().get("h200-sxm")


def trace(data, name):
    return [b[0] for b in ReplaySource(data / f"h200-{name}.jsonl.gz").batches()]


def timeline(data, name):
    return json.loads(gzip.decompress((data / f"timeline-{name}.json.gz").read_bytes()))


def work_between(tl, start, end):
    return timeline_work(tl["start_wall"], tl["ends_wall"], tl["work_per_iteration"], start, end)


def loaded_windows(data, name, precision):
    """(sample, MFU) for every window the loop kept busy from start to end."""
    tl = timeline(data, name)
    peak = H200.peak_flops(precision)
    out = []
    for s in trace(data, name):
        start = s.timestamp_seconds - s.window_seconds
        if tl["start_wall"] < start and tl["ends_wall"][-1] > s.timestamp_seconds:
            out.append((s, work_between(tl, start, s.timestamp_seconds) / s.window_seconds / peak))
    return out


@pytest.mark.parametrize(
    "name, precision, windows", [("bf16-gemm", "bf16", 19), ("fp8-gemm", "fp8", 19), ("transformer", "bf16", 15)]
)
def test_ofu_matches_timed_mfu_with_the_measured_reference_clock(h200_trace, name, precision, windows):
    """f_ref = 1830 MHz / the probe's 0.903 (2027 MHz): mean OFU - MFU +0.32 pp on the bf16 GEMM
    (not tile-corrected), -0.75 pp on the fp8 GEMM, -1.08 pp on the transformer, whose windows also
    hold non-GEMM kernels (docs/validation/ofu.md, "The reference clock")."""
    pairs = loaded_windows(h200_trace, name, precision)
    assert len(pairs) >= windows
    errors = [(ofu(s, H200).ofu_ratio - mfu) * 100 for s, mfu in pairs]
    assert max(abs(e) for e in errors) < 2.5  # pp, every window
    assert abs(statistics.mean(errors)) < 1.2
    # the datasheet-arithmetic clock (1830 MHz) over-states every workload by 2.1 to 7.6 pp
    datasheet = [(ofu_ratio(s.tensor_active_ratio, s.sm_clock_mean_hertz, 1.83e9) - mfu) * 100 for s, mfu in pairs]
    assert min(datasheet) > 2.0
    assert statistics.mean(datasheet) > 2 * abs(statistics.mean(errors))


def test_bf16_gemm_steady_state_values(h200_trace):
    s = trace(h200_trace, "bf16-gemm")[3]
    assert s.tensor_active_ratio == pytest.approx(0.9362937343276384, abs=0)
    assert s.sm_clock_mean_hertz / 1e6 == pytest.approx(1446.0, abs=1.0)
    assert ofu(s, H200).ofu_ratio == pytest.approx(0.66822, abs=1e-5)  # f_ref 2027 MHz (1830 / 0.903)
    assert classify(s) is Bottleneck.TENSOR


def test_watch_once_during_bf16_gemm_was_within_5_pp_of_mfu(h200_trace):
    """The issue's acceptance check, as recorded: three `watch --once --json` windows."""
    recorded = json.loads((h200_trace / "watch-once-during-bf16-gemm.json").read_text())
    tl = timeline(h200_trace, "watch")
    peak = H200.peak_flops("bf16")
    for check in recorded["loaded"]:
        row = check["watch"]
        end, span = row["timestamp_seconds"], row["window_seconds"]
        mfu = work_between(tl, end - span, end) / span / peak
        assert mfu == pytest.approx(check["mfu_ratio"], rel=1e-9)
        assert abs(ofu_ratio(row["tensor_active_ratio"], row["sm_clock_mean_hertz"], H200.ofu_clock_hertz) - mfu) < 0.05
    assert recorded["idle"]["ofu_ratio"] < 0.01


@pytest.mark.parametrize(
    "name, expected",
    [("idle", Bottleneck.IDLE), ("bf16-gemm", Bottleneck.TENSOR), ("copy", Bottleneck.MEMORY),
     ("transformer", Bottleneck.MIXED)],
)
def test_bottleneck_of_steady_windows(h200_trace, name, expected):
    steady = trace(h200_trace, name)[-10:-2] if name != "transformer" else trace(h200_trace, name)[10:20]
    assert {classify(s) for s in steady} == {expected}


def test_idle_gpu_reads_zero_ofu(h200_trace):
    summary = summarize(trace(h200_trace, "idle"), H200)
    assert summary.ofu_ratio == 0.0 and summary.windows == 24 and summary.seconds_missing == 0.0


def test_resampling_to_10_s_keeps_the_time_weighted_ofu(h200_trace):
    samples = trace(h200_trace, "bf16-gemm")
    merged = resample(samples, 10.0)
    assert [round(m.window_seconds) for m in merged] == [10, 10, 4]
    assert sum(m.sm_clock_polls for m in merged) == sum(s.sm_clock_polls for s in samples)
    assert summarize(merged, H200).ofu_ratio == pytest.approx(summarize(samples, H200).ofu_ratio, rel=1e-3)


def test_clock_needs_dense_reads_under_a_swinging_clock(h200_trace):
    """2-ms SM clock reads under load: one read per 1-s window is off by several percent
    at the 95th percentile; the sampler's default 10 reads keep it under 0.5 %."""
    runs = json.loads(gzip.decompress((h200_trace / "clock-reads-2ms.json.gz").read_bytes()))
    reads = [(t, mhz * 1e6) for t, mhz in runs["transformer"]]
    p95 = lambda xs: sorted(xs)[int(0.95 * len(xs))]  # noqa: E731
    one = clock_sampling_errors(reads, 1.0, 1)
    ten = clock_sampling_errors(reads, 1.0, 10)
    assert p95(one) > 0.05
    assert p95(ten) < 0.005
    assert statistics.mean(ten) < statistics.mean(one) / 10


def test_two_gpu_host_each_gpu_its_own_row_and_class():
    """2x H200 recorded by bench/h200x2_run.sh: GPU 0 ran a bf16 GEMM loop, GPU 1 a copy loop."""
    path = Path(__file__).parents[1] / "data" / "h200x2" / "h200x2-gemm-copy.jsonl.gz"
    batches = list(ReplaySource(path).batches())
    assert len(batches) == 15 and all(len(b) == 2 for b in batches)
    gpus = by_gpu(s for b in batches for s in b)
    gemm, copy = (gpus[key][3:] for key in sorted(gpus, key=lambda k: gpus[k][0].gpu_index))
    assert {classify(s) for s in gemm} == {Bottleneck.TENSOR}
    assert {classify(s) for s in copy} == {Bottleneck.MEMORY}
    assert {p.pid for s in gemm for p in s.processes} == {578}
    assert {p.pid for s in copy for p in s.processes} == {579}
    view = fleet([(summarize(gemm, H200), H200), (summarize(copy, H200), H200)])
    assert view["gpus"] == 2 and view["capacity_weighted_ofu_ratio"] == pytest.approx(view["mean_ofu_ratio"])
    assert 0.33 < view["mean_ofu_ratio"] < 0.35  # one GPU at ~0.68, one at 0


def sweep_points():
    sweep = Path(__file__).parents[1] / "data" / "h200-sweep"
    with gzip.open(sweep / "sweep-points.jsonl.gz", "rt") as f:
        points = [json.loads(line) for line in f]
    samples = [b[0] for b in ReplaySource(sweep / "sweep-trace.jsonl.gz").batches()]
    return gemm_points(points, samples, H200)


def test_gemm_sweep_table_ii_on_the_h200():
    """The GEMM sweep (kernelfleet bench ofu) on an H200: 60 points, five precisions (docs/validation/ofu.md)."""
    rows = sweep_points()
    assert len(rows) == 60 and all(r.tile is not None for r in rows)
    table = {s.precision: s for s in summarize_errors(rows)}
    assert {p: s.points for p, s in table.items()} == {"bf16": 15, "fp16": 15, "tf32": 15, "fp8": 11, "fp64": 4}
    # OFU at each precision's f_ref: 1830 / 0.903 = 2027 MHz (HMMA pipe), fp64 1980 / 0.995 = 1990 MHz
    assert {p: round(s.raw_mae_pp, 3) for p, s in table.items()} == {
        "bf16": 1.187, "fp16": 0.806, "tf32": 1.256, "fp8": 0.433, "fp64": 0.558}
    # corrected with the tile and the thread-block cluster of the kernel that ran (ofu/kernel_tiles.py)
    assert {p: round(s.corrected_mae_pp, 3) for p, s in table.items()} == {
        "bf16": 0.657, "fp16": 0.371, "tf32": 0.797, "fp8": 0.503, "fp64": 0.336}
    for p, s in table.items():  # the correction helps wherever errors sit above zero; fp8's sit on both sides
        assert (s.corrected_mae_pp < s.raw_mae_pp) == (p != "fp8")
    # unaligned shapes carry the tile-quantization error the correction removes
    unaligned = {(r.precision, r.m): r for r in rows if r.m in (1000, 3000, 8200)}
    assert unaligned["bf16", 8200].raw_error_pp == pytest.approx(2.56, abs=0.01)
    assert unaligned["bf16", 8200].corrected_error_pp == pytest.approx(-0.74, abs=0.01)
    assert all(abs(r.corrected_error_pp) < abs(r.raw_error_pp) for r in unaligned.values())
    # rounding to whole 2x4 clusters moves the 512^3 and 200^3 nvjet points (bf16 512^3: +0.85 -> +0.06 pp)
    by_shape = {(r.precision, r.m, r.n, r.k): r for r in rows}
    assert by_shape["bf16", 512, 512, 512].cluster == (2, 4)
    assert by_shape["bf16", 512, 512, 512].corrected_error_pp == pytest.approx(0.06, abs=0.01)
    assert by_shape["fp8", 16384, 2048, 8192].corrected_error_pp == pytest.approx(-1.02, abs=0.01)


def test_table_ii_rows_of_the_report():
    """``bench ofu-report``'s first section: Table II, each precision's f_ref, the targets, the in-sample fit."""
    sweep = files.read_sweep(Path(__file__).parents[1] / "data" / "h200-sweep")
    t = report.table_ii(sweep, H200)
    bf16 = t.errors[0]
    assert (bf16.precision, bf16.points, bf16.raw_within_2pp, bf16.raw_within_5pp) == ("bf16", 15, 0.8, 1.0)
    assert (bf16.corrected_within_2pp, bf16.corrected_within_5pp) == (14 / 15, 1.0)
    assert (round(bf16.raw_mae_pp, 2), round(bf16.corrected_mae_pp, 2)) == (1.19, 0.66)
    fp64 = t.reference_clocks[-1]
    assert (fp64.precision, fp64.basis, fp64.peak_clock_hertz, round(fp64.hertz / 1e6)) == ("fp64", "measured", 1.98e9, 1990)
    assert fp64.peak_clock_hertz / fp64.hertz == pytest.approx(0.995)
    targets = {g.precision: g for g in t.targets}
    assert list(targets) == ["bf16", "fp16", "tf32", "fp8"]
    assert targets["bf16"].target_mae_pp == 0.5 and round(targets["bf16"].miss_pp, 2) == 0.16  # missed
    assert targets["fp16"].target_mae_pp == 0.5 and round(targets["fp16"].miss_pp, 2) == -0.13  # met, 0.13 to spare
    assert {q: round(hz / 1e6) for q, hz in t.fitted_clock_hertz.items()} == {
        "bf16": 2005, "fp16": 2019, "tf32": 2026, "fp8": 2015, "fp64": 1983}


def test_tile_model_equals_nsight_compute_executed_tensor_ops():
    """ncu (--clock-control none) counted the HGMMA math ops of bf16 GEMMs on the H200
    (an early three-kernel run; bench/ncu_sweep.sh now profiles every sweep kernel, checked in
    test_ncu_sweep.py): they equal the executed FLOPs predicted from the kernel name."""
    path = Path(__file__).parents[1] / "data" / "h200-sweep" / "ncu-bf16-gemms.csv"
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["Metric Name"] == "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum"]
    shapes = [(8192, 8192, 8192)] * 2 + [(8200, 8200, 8200)] * 2 + [(8192, 8192, 1024)] * 2  # launch order
    assert len(rows) == len(shapes)
    for row, (m, n, k) in zip(rows, shapes):
        assert executed_flops_of_kernel(m, n, k, row["Kernel Name"]) == int(row["Metric Value"].replace(",", ""))


def test_one_clock_read_per_window_averages_out_in_steady_runs_but_not_across_changes():
    """The sampling study of docs/validation/ofu.md: the five single-GPU loops and the two-GPU
    data-parallel job (each GPU its own series; its clean phase is busy and densely read, its
    slowed phase neither, so only the clean 40 s of each GPU count as steady)."""
    data = Path(__file__).parents[1] / "data"
    loops = [data / "h200" / f"h200-{n}.jsonl.gz" for n in ("bf16-gemm", "fp8-gemm", "transformer")]
    loops += [data / "h200-detector" / f"h200-{n}.jsonl.gz" for n in ("drop", "gaps")]
    samples = [[b[0] for b in ReplaySource(p).batches()] for p in loops]
    ddp = [s for b in ReplaySource(data / "h200x2-detector" / "h200x2-ddp.jsonl.gz").batches() for s in b]
    steady = {w: [e for s in samples + [ddp] for e in instant_clock_errors_pp(s, H200, w, steady_only=True)]
              for w in (1.0, 10.0, 30.0)}
    assert {w: len(e) for w, e in steady.items()} == {1.0: 243, 10.0: 23, 30.0: 3}
    assert {w: round(statistics.mean(e), 2) for w, e in steady.items()} == {1.0: 0.89, 10.0: 0.46, 30.0: 0.48}  # pp
    # the two GPUs' 30-s windows under a power-capped clock swinging 1470-1590 MHz stay 0.6-0.8 pp off
    assert sorted(round(e, 2) for e in steady[30.0]) == [0.02, 0.65, 0.77]
    all_10 = [e for s in samples for e in instant_clock_errors_pp(s, H200, 10.0)]
    assert len(all_10) == 27 and statistics.mean(all_10) > 3.0  # windows holding a start, end or pause


def test_windows_read_once_have_no_dense_mean_to_compare_with():
    """Adaptive polling read the DDP job's slowed phase (tensor pipe busy 20 %, clock held at
    1980 MHz) and its idle stretches once a window: there the instant read *is* the mean, so
    those windows are left out rather than counted as exact."""
    path = Path(__file__).parents[1] / "data" / "h200x2-detector" / "h200x2-ddp.jsonl.gz"
    ddp = [s for b in ReplaySource(path).batches() for s in b]
    assert {s.sm_clock_polls for s in ddp} == {1, 10}
    sparse = [s for s in ddp if s.sm_clock_polls == 1]
    assert len(sparse) == 116 and sum(s.tensor_active_ratio >= 0.01 for s in sparse) == 80  # 1-s windows
    assert instant_clock_errors_pp(sparse, H200, 1.0) == []
    assert len(instant_clock_errors_pp(ddp, H200, 1.0)) == 83  # the densely read busy windows, merged to >= 1 s
