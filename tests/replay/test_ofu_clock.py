"""The 0.908 clock question (bench/ofu_clock_check.py; docs/validation/ofu.md, "The residual").

On the GMMA paths the sweep's loops did full-rate math on GPM's busy fraction at 0.908 × NVML's
SM clock. The clock check measures, over the same counter windows of steady GEMM loops, the SM
cycles a probe kernel counted (``%clock64`` against ``%globaltimer``) and, under Nsight Compute, the
cycles one kernel takes: if SM cycles elapse at 0.908 × NVML's clock, GPM is right ("cycles"); if
at NVML's clock, GPM counts ~10 % more busy cycles than the math needs ("gpm").

The module-level tests build runs by hand to pin the analysis (``ofu/validation.py: loop_clocks``,
``ofu/ncu.py: ncu_clocks, clock_verdict``) and the file format the bench script writes.
``TestRecordedH200Run`` replays the H200 run in tests/data/h200-clock/; it is collected once that
run is committed (delete its ``__test__ = False``).
"""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel
from kernelfleet.ofu.ncu import (
    CLOCK_TOLERANCE,
    NcuKernel,
    clock_verdict,
    executed_ops,
    loop_cycle_ratios,
    ncu_clocks,
    ncu_point,
    parse_ncu_csv,
)
from kernelfleet.ofu.tiles import gemm_flops
from kernelfleet.ofu.validation import (
    FLOPS_PER_ACTIVE_CYCLE,
    idle_probe_over_nvml,
    loop_clocks,
    probe_clock_hertz,
    tensor_path,
)
from kernelfleet.telemetry.replay import ReplaySource, TraceWriter
from kernelfleet.telemetry.sample import Sample

H200 = Catalog.load().get("h200-sxm")
ROOT = Path(__file__).parents[2]
RECORDED = ROOT / "tests" / "data" / "h200-clock"
SWEEP = ROOT / "tests" / "data" / "h200-sweep"
NVML_HZ = 1.5e9
# (precision, M, N, K, the kernel an H200 ran for it in the sweep)
BF16 = ("bf16", 8192, 8192, 8192, "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT")
FP64 = ("fp64", 8192, 8192, 8192,
        "sm90_xmma_gemm_f64f64_f64f64_f64_nn_n_tilesize128x64x16_stage3_warpsize2x2x1_tensor16x8x8_execute_kernel__5x_cublas")


def probe(launch_wall: float, seconds: float, cycles_hz: float, period: float = 0.002) -> dict:
    """The probe's record as bench/ofu_clock_check.py writes it: its SM counting cycles_hz."""
    timer0 = 7_000_000_000
    samples = [[timer0 + round(i * period * 1e9), round(i * period * cycles_hz), 96]
               for i in range(int(seconds / period))]
    return {"launch_wall": launch_wall, "launch_returned_wall": launch_wall + 2e-5, "period_seconds": period, "smid": 0,
            "samples": samples}


def synthetic_run(cycles_over_nvml: float, gpm_over_math: float, t0: float = 1.8e9):
    """Loop lines, counter windows and NVML reads of a run where NVML reads 1500 MHz, SM cycles elapse at
    ``cycles_over_nvml`` × that on the GMMA point (the DMMA point at NVML's clock) and GPM reads
    ``gpm_over_math`` × the busy fraction the math needs (DMMA: exactly it)."""
    lines = [{"idle": True, "start_wall": t0 + 0.3, "end_wall": t0 + 0.95, "probe": probe(t0, 1.0, NVML_HZ)}]
    samples, t = [], t0 + 2.0
    for precision, m, n, k, kernel in (BF16, FP64):
        gmma = precision != "fp64"
        cycles_hz, over = (cycles_over_nvml * NVML_HZ, gpm_over_math) if gmma else (NVML_HZ, 1.0)
        needed = 0.75  # pipe-busy fraction the math needs at the cycles' rate
        executed = executed_flops_of_kernel(m, n, k, kernel)
        executed_per_second = needed * H200.sm_count * FLOPS_PER_ACTIVE_CYCLE[precision] * cycles_hz
        useful_per_second = executed_per_second * gemm_flops(m, n, k) / executed
        step = gemm_flops(m, n, k) / useful_per_second
        ends = [t + step * (i + 1) for i in range(int(3.0 / step))]
        lines.append({"m": m, "n": n, "k": k, "precision": precision, "kernels": ["Memset (Device)", kernel],
                      "gemms_per_replay": 1, "work_per_iteration": gemm_flops(m, n, k), "start_wall": t,
                      "ends_wall": ends, "probe": probe(t - 0.6, 4.0, cycles_hz)})
        samples += [Sample(timestamp_seconds=t + 0.75 + 0.5 * j, window_seconds=0.5, gpu_index=0, uuid="GPU-0",
                           name="NVIDIA H200", tensor_active_ratio=needed * over, sm_clock_mean_hertz=NVML_HZ)
                    for j in range(5)]
        t += 5.0
    reads = [[t0 + i / 1000, NVML_HZ / 1e6, 4 if i % 10 == 0 else None] for i in range(int((t - t0) * 1000))]
    return lines, samples, reads


def ncu_run(lines, cycles_over_nvml: float, t0: float = 1.9e9):
    """Three launches of the GMMA point under ncu, each taking as many cycles as in the loop."""
    (loop,) = [c for c in loop_clocks(lines, *synthetic_run(cycles_over_nvml, 1.0)[1:], H200) if c.path == "gmma"]
    cycles = cycles_over_nvml * NVML_HZ * loop.kernel_seconds
    launches, rows = [], ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
    for i in range(3):
        launches.append({"m": 8192, "n": 8192, "k": 8192, "precision": "bf16", "launch": i,
                         "before": t0 + i, "after": t0 + i + 0.2})
        for name, value in (("sm__cycles_elapsed.avg", cycles), ("sm__cycles_elapsed.avg.per_second", 1.6e9),
                            ("gpu__time_duration.sum", 1.4e6)):
            rows.append(f'"{i}","{BF16[4]}","{name}","x","{value:,.2f}"')
    reads = [[t0 + i / 1000, 1980, None] for i in range(3000)]
    return launches, "\n".join(rows) + "\n", reads


@pytest.mark.unit
def test_the_probe_rate_is_clock_ticks_over_timer_nanoseconds():
    record = probe(100.0, 2.0, 1.234e9)
    assert probe_clock_hertz(record, 100.5, 101.5) == pytest.approx(1.234e9, rel=1e-6)
    assert probe_clock_hertz(record, 103.0, 104.0) is None  # after the probe ended
    assert probe_clock_hertz(None, 100.5, 101.5) is None


@pytest.mark.unit
def test_paths_follow_the_kernel():
    assert tensor_path("bf16", BF16[4]) == "gmma" and tensor_path("fp64", FP64[4]) == "dmma"
    assert tensor_path("tf32", "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>") == "mma.sync"


@pytest.mark.unit
def test_a_slower_sm_clock_reads_as_cycles():
    lines, samples, reads = synthetic_run(cycles_over_nvml=0.908, gpm_over_math=1.0)
    loops = loop_clocks(lines, samples, reads, H200)
    gmma, dmma = (next(c for c in loops if c.path == p) for p in ("gmma", "dmma"))
    assert gmma.windows == 5 and gmma.true_over_nvml == pytest.approx(0.908, rel=1e-3)
    assert gmma.probe_over_nvml == pytest.approx(0.908, rel=1e-3)
    assert gmma.gpm_over_math == pytest.approx(1.0, rel=1e-3)
    assert dmma.true_over_nvml == pytest.approx(1.0, rel=1e-3) and gmma.power_capped_ratio == 1.0
    verdict = clock_verdict(loops, idle_probe=idle_probe_over_nvml(lines, reads))
    assert verdict.finding == "cycles" and verdict.idle_probe_over_nvml == pytest.approx(1.0, rel=1e-3)
    assert verdict.describe().startswith("SM cycles elapse slower than NVML reports")


@pytest.mark.unit
def test_an_overcounting_gpm_reads_as_gpm():
    loops = loop_clocks(*synthetic_run(cycles_over_nvml=1.0, gpm_over_math=1.1), H200)
    verdict = clock_verdict(loops)
    assert verdict.finding == "gpm" and verdict.true_over_nvml == pytest.approx(1 / 1.1, rel=1e-3)
    assert verdict.gpm_over_math == pytest.approx(1.1, rel=1e-3)


@pytest.mark.unit
def test_no_gap_and_measurements_between_the_two():
    assert clock_verdict(loop_clocks(*synthetic_run(1.0, 1.0), H200)).finding == "not-reproduced"
    assert clock_verdict(loop_clocks(*synthetic_run(0.95, 1.05), H200)).finding == "mixed"
    lines, samples, reads = synthetic_run(0.908, 1.0)
    no_probe = [{k: v for k, v in line.items() if k != "probe"} for line in lines]
    assert clock_verdict(loop_clocks(no_probe, samples, reads, H200)).finding == "undecided"
    assert CLOCK_TOLERANCE < (1 - 0.908) / 2  # the two explanations cannot both fit one number


@pytest.mark.unit
def test_ncu_cycles_per_kernel_over_its_loop_time_decide_without_the_probe():
    lines, samples, reads = synthetic_run(0.908, 1.0)
    no_probe = [{k: v for k, v in line.items() if k != "probe"} for line in lines]
    loops = loop_clocks(no_probe, samples, reads, H200)
    launches, csv_text, ncu_reads = ncu_run(lines, 0.908)
    kernels = parse_ncu_csv(csv_text)
    ncu = ncu_clocks(launches, kernels, ncu_reads)
    assert len(ncu) == 3
    assert all(c.nvml_reads == 201 and c.ncu_over_nvml == pytest.approx(1.6 / 1.98) for c in ncu)
    assert loop_cycle_ratios(loops, ncu) == {("bf16", 8192, 8192, 8192): pytest.approx(0.908, rel=1e-3)}
    assert clock_verdict(loops, ncu).finding == "cycles"
    with pytest.raises(UsageError, match="2 launches but ncu profiled 3 kernels"):
        ncu_clocks(launches[:2], kernels, ncu_reads)


def read_jsonl(path: Path) -> list:
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines()]


def write_jsonl_gz(path: Path, records) -> None:
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))


@pytest.mark.unit
def test_the_ncu_reruns_counts_fp8_split_totals_and_a_kernel2_named_by_its_base_name():
    """The re-run of bench/ncu_sweep.sh (docs/validation/ofu.md): fp8 ops where a chip lists only the
    _dst_ split, never twice; a CUTLASS 2.x kernel's tile read from the sweep's name if ncu prints ``Kernel2``."""
    split = {"sm__ops_path_tensor_src_fp8_dst_fp16.sum": 3.0, "sm__ops_path_tensor_src_fp8_dst_fp32.sum": 5.0}
    assert executed_ops("fp8", split) == 8
    assert executed_ops("fp8", {**split, "sm__ops_path_tensor_src_fp8.sum": 8.0}) == 8
    assert executed_ops("fp64", split) is None
    kernel2 = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(Params)"
    metrics = {"sm__pipe_tensor_cycles_active.sum": 4.0 * 132, "sm__cycles_elapsed.avg": 2.0,
               "sm__cycles_elapsed.avg.per_second": 1.8e9, "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum": 7.0}
    point = {"m": 200, "n": 200, "k": 200, "precision": "tf32"}
    counted = ncu_point(point, NcuKernel("Kernel2", "(4, 4, 1)", metrics), 132, model_name=kernel2)
    assert counted.executed_ops == 7 and counted.tile is not None and (counted.tile.m, counted.tile.n) == (64, 64)
    assert counted.name_executed_flops == 2 * 256 * 256 * 224 and counted.kernel == "Kernel2"


def write_run(folder: Path, lines, samples, reads) -> None:
    """The files bench/ofu_clock_check.py loop writes."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl_gz(folder / "clock-loop.jsonl.gz", lines)
    write_jsonl_gz(folder / "nvml-clock-loop.jsonl.gz", reads)
    with TraceWriter(folder / "clock-trace.jsonl.gz") as writer:
        for s in samples:
            writer.write([s])


def report(folder: Path) -> str:
    command = [sys.executable, "-m", "kernelfleet", "bench", "ofu-report", str(SWEEP), "--clock", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.unit
def test_ofu_report_reads_the_files_and_prints_the_verdict(tmp_path):
    lines, samples, reads = synthetic_run(0.908, 1.0)
    write_run(tmp_path, lines, samples, reads)
    out = report(tmp_path)
    assert "Clock check: 2 loops, 0 launches under ncu" in out
    assert "| bf16 | 8192×8192×8192 | gmma | 5 |" in out and "| 0.908 | 0.908 | 1.000 | — | 100% | 0% |" in out
    assert "verdict: cycles: SM cycles elapse slower than NVML reports" in out
    # with the ncu half (bench/ofu_clock_check.py ncu)
    launches, csv_text, ncu_reads = ncu_run(lines, 0.908)
    (tmp_path / "ncu-clock-launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in launches))
    (tmp_path / "ncu-clock.csv").write_text("==PROF== Connected to process 1\n" + csv_text)
    write_jsonl_gz(tmp_path / "nvml-clock-ncu.jsonl.gz", ncu_reads)
    out = report(tmp_path)
    assert "Clock check: 2 loops, 3 launches under ncu" in out and "| 0.908 | 100% | 0% |" in out
    assert "| bf16 | 8192×8192×8192 | gmma | 1400.0 | 1600 | 1980 (201) | 1980 | 0.808 |" in out
    # a launch ncu did not profile leaves the ncu half out, and the probe still decides
    (tmp_path / "ncu-clock-launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in launches * 2))
    out = report(tmp_path)
    assert "the ncu half is left out: 6 launches but ncu profiled 3 kernels" in out and "verdict: cycles" in out


class TestRecordedH200Run:
    """The H200 run of ``bash bench/ofu_h200_check.sh`` (stage clock), unpacked into tests/data/h200-clock."""

    __test__ = False  # collected once tests/data/h200-clock/ holds the run: delete this line then

    pytestmark = pytest.mark.replay

    @pytest.fixture(scope="class")
    def run(self):
        lines, reads = read_jsonl(RECORDED / "clock-loop.jsonl.gz"), read_jsonl(RECORDED / "nvml-clock-loop.jsonl.gz")
        samples = [b[0] for b in ReplaySource(RECORDED / "clock-trace.jsonl.gz").batches()]
        launches = read_jsonl(RECORDED / "ncu-clock-launches.jsonl")
        kernels = parse_ncu_csv((RECORDED / "ncu-clock.csv").read_text())
        return lines, samples, reads, ncu_clocks(launches, kernels, read_jsonl(RECORDED / "nvml-clock-ncu.jsonl.gz"))

    @pytest.fixture(scope="class")
    def loops(self, run):
        lines, samples, reads, _ = run
        return loop_clocks(lines, samples, reads, H200)

    def test_every_point_ran_with_windows_probe_and_dense_reads(self, run, loops):
        lines = run[0]
        assert not [line for line in lines if "error" in line]
        assert len(loops) == 9 and all(c.windows >= 3 and c.probe_sm_clock_hertz is not None for c in loops)
        assert {c.path for c in loops} == {"gmma", "dmma", "mma.sync"}
        assert all(c.power_capped_ratio is not None for c in loops)  # the reasons were read
        # no probe waited for Triton to compile at its launch: its timer maps to wall time from there
        probes = [line["probe"] for line in lines if "probe" in line]
        assert len(probes) == 11 and all(p["launch_returned_wall"] - p["launch_wall"] < 0.005 for p in probes)

    def test_the_probe_alone_counts_the_cycles_nvmls_clock_implies(self, run):
        lines, _, reads, _ = run
        assert idle_probe_over_nvml(lines, reads) == pytest.approx(1.0, abs=0.02)

    def test_the_sweeps_gap_is_reproduced_on_gmma_and_absent_on_dmma(self, loops):
        verdict = clock_verdict(loops)
        assert 0.87 < verdict.true_over_nvml < 0.94
        assert verdict.dmma_true_over_nvml == pytest.approx(1.0, abs=0.02)

    def test_every_launch_under_ncu_is_paired_and_read_by_nvml(self, run):
        ncu = run[3]
        assert len(ncu) == 9 * 3 and all(c.nvml_reads > 0 for c in ncu)

    def test_the_verdict_is_one_of_the_two_explanations(self, run, loops):
        lines, _, reads, ncu = run
        verdict = clock_verdict(loops, ncu, idle_probe_over_nvml(lines, reads))
        assert verdict.finding in ("cycles", "gpm"), verdict.describe()

    def test_ofu_report_prints_the_verdict(self):
        assert "\nverdict: " in report(RECORDED)
