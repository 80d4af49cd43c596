"""The clock check's analysis on runs built by hand (validation/clock_check.py; bench/ofu_clock_check.py).

Each synthetic run is what the bench script writes for a GPU where NVML reads 1500 MHz and SM
cycles elapse at a chosen ratio of that on the GMMA point (the DMMA point at NVML's clock), with
GPM reading a chosen multiple of the busy fraction the math needs. The recorded H200 run is
replayed in tests/replay/test_ofu_clock.py.
"""

import gzip
import json
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel
from kernelfleet.ofu.tiles import gemm_flops
from kernelfleet.telemetry.ncu import parse_ncu_csv
from kernelfleet.telemetry.replay import TraceWriter
from kernelfleet.telemetry.sample import Sample
from kernelfleet.validation import clock_check, files, report

pytestmark = pytest.mark.unit
H200 = Catalog.load().get("h200-sxm")
NVML_HZ = 1.5e9
# (precision, M, N, K, the kernel an H200 ran for it in the sweep)
BF16 = ("bf16", 8192, 8192, 8192, "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT")
FP64 = ("fp64", 8192, 8192, 8192,
        "sm90_xmma_gemm_f64f64_f64f64_f64_nn_n_tilesize128x64x16_stage3_warpsize2x2x1_tensor16x8x8_execute_kernel__5x_cublas")
KERNEL2 = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>"


def probe(launch_wall: float, seconds: float, cycles_hz: float, period: float = 0.002) -> dict:
    """The probe's record as bench/ofu_clock_check.py writes it: its SM counting cycles_hz."""
    timer0 = 7_000_000_000
    samples = [[timer0 + round(i * period * 1e9), round(i * period * cycles_hz), 96]
               for i in range(int(seconds / period))]
    return {"launch_wall": launch_wall, "launch_returned_wall": launch_wall + 2e-5, "period_seconds": period, "smid": 0,
            "samples": samples}


def synthetic_run(cycles_over_nvml: float, gpm_over_math: float, t0: float = 1.8e9, idle_over_nvml: float = 1.0,
                  probe_seconds: float = 4.0):
    """Loop lines, counter windows and NVML reads of a run where NVML reads 1500 MHz, SM cycles elapse at
    ``cycles_over_nvml`` × that on the GMMA point (the DMMA point at NVML's clock) and GPM reads
    ``gpm_over_math`` × the busy fraction the math needs (DMMA: exactly it)."""
    lines = [{"idle": True, "start_wall": t0 + 0.3, "end_wall": t0 + 0.95,
              "probe": probe(t0, 1.0, idle_over_nvml * NVML_HZ)}]
    samples, t = [], t0 + 2.0
    for precision, m, n, k, kernel in (BF16, FP64):
        gmma = precision != "fp64"
        cycles_hz, over = (cycles_over_nvml * NVML_HZ, gpm_over_math) if gmma else (NVML_HZ, 1.0)
        needed = 0.75  # pipe-busy fraction the math needs at the cycles' rate
        executed = executed_flops_of_kernel(m, n, k, kernel)
        executed_per_second = needed * H200.sm_count * clock_check.path_flops_per_active_cycle(precision, "gmma") * cycles_hz
        useful_per_second = executed_per_second * gemm_flops(m, n, k) / executed
        step = gemm_flops(m, n, k) / useful_per_second
        ends = [t + step * (i + 1) for i in range(int(3.0 / step))]
        lines.append({"m": m, "n": n, "k": k, "precision": precision, "kernels": ["Memset (Device)", kernel],
                      "gemms_per_replay": 1, "work_per_iteration": gemm_flops(m, n, k), "start_wall": t,
                      "ends_wall": ends, "probe": probe(t - 0.6, probe_seconds, cycles_hz)})
        samples += [Sample(timestamp_seconds=t + 0.75 + 0.5 * j, window_seconds=0.5, gpu_index=0, uuid="GPU-0",
                           name="NVIDIA H200", tensor_active_ratio=needed * over, sm_clock_mean_hertz=NVML_HZ)
                    for j in range(5)]
        t += 5.0
    reads = [[t0 + i / 1000, NVML_HZ / 1e6, 4 if i % 10 == 0 else None] for i in range(int((t - t0) * 1000))]
    return lines, samples, reads


def ncu_run(lines, cycles_over_nvml: float, t0: float = 1.9e9, nvml_mhz: float = 1980, loop_cycles: float = 0.908):
    """Three launches of the GMMA point under ncu, each taking ``cycles_over_nvml`` × NVML's loop clock
    × its loop time in cycles, and counting them at ``cycles_over_nvml`` × ``nvml_mhz``."""
    (loop,) = [c for c in clock_check.loop_clocks(lines, *synthetic_run(loop_cycles, 1.0)[1:], H200) if c.path == "gmma"]
    cycles = cycles_over_nvml * NVML_HZ * loop.kernel_seconds
    launches, rows = [], ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
    for i in range(3):
        launches.append({"m": 8192, "n": 8192, "k": 8192, "precision": "bf16", "launch": i,
                         "before": t0 + i, "after": t0 + i + 0.2})
        for name, value in (("sm__cycles_elapsed.avg", cycles),
                            ("sm__cycles_elapsed.avg.per_second", cycles_over_nvml * nvml_mhz * 1e6),
                            ("gpu__time_duration.sum", 1.4e6)):
            rows.append(f'"{i}","{BF16[4]}","{name}","x","{value:,.2f}"')
    reads = [[t0 + i / 1000, nvml_mhz, None] for i in range(3000)]
    return launches, "\n".join(rows) + "\n", reads


def without_probe(lines):
    return [{k: v for k, v in line.items() if k != "probe"} for line in lines]


def test_the_probe_rate_is_clock_ticks_over_timer_nanoseconds():
    record = probe(100.0, 2.0, 1.234e9)
    assert clock_check.probe_clock_hertz(record, 100.5, 101.5) == pytest.approx(1.234e9, rel=1e-6)
    assert clock_check.probe_clock_hertz(record, 103.0, 104.0) is None  # after the probe ended
    assert clock_check.probe_clock_hertz(None, 100.5, 101.5) is None


def test_paths_and_their_rate_per_active_cycle_follow_the_kernel():
    assert clock_check.tensor_path("bf16", BF16[4]) == "gmma" and clock_check.tensor_path("fp64", FP64[4]) == "dmma"
    assert clock_check.tensor_path("tf32", KERNEL2) == "mma.sync"
    assert clock_check.path_flops_per_active_cycle("tf32", "gmma") == 2048
    # sm80 mma.sync on Hopper: ncu counted two thirds of the warpgroup rate; never counted for bf16
    assert clock_check.path_flops_per_active_cycle("tf32", "mma.sync") == pytest.approx(4096 / 3)
    assert clock_check.path_flops_per_active_cycle("bf16", "mma.sync") is None


def test_a_slower_sm_clock_reads_as_cycles():
    lines, samples, reads = synthetic_run(cycles_over_nvml=0.908, gpm_over_math=1.0)
    loops = clock_check.loop_clocks(lines, samples, reads, H200)
    gmma, dmma = (next(c for c in loops if c.path == p) for p in ("gmma", "dmma"))
    assert gmma.windows == gmma.probe_windows == 5 and gmma.true_over_nvml == pytest.approx(0.908, rel=1e-3)
    assert gmma.probe_over_nvml == pytest.approx(0.908, rel=1e-3)
    assert gmma.gpm_over_math == pytest.approx(1.0, rel=1e-3)
    assert dmma.true_over_nvml == pytest.approx(1.0, rel=1e-3) and gmma.power_capped_ratio == 1.0
    verdict = clock_check.clock_verdict(loops, idle_probe=clock_check.idle_probe_over_nvml(lines, reads))
    assert verdict.finding == "cycles" and verdict.decided_by == "probe"
    assert verdict.idle_probe_over_nvml == pytest.approx(1.0, rel=1e-3)
    assert verdict.dmma_probe_over_nvml == pytest.approx(1.0, rel=1e-3)
    assert verdict.describe().startswith("SM cycles elapse slower than NVML reports")


def test_an_overcounting_gpm_reads_as_gpm():
    loops = clock_check.loop_clocks(*synthetic_run(cycles_over_nvml=1.0, gpm_over_math=1.1), H200)
    verdict = clock_check.clock_verdict(loops)
    assert verdict.finding == "gpm" and verdict.true_over_nvml == pytest.approx(1 / 1.1, rel=1e-3)
    assert verdict.gpm_over_math == pytest.approx(1.1, rel=1e-3)


def test_no_gap_and_measurements_between_the_two():
    assert clock_check.clock_verdict(clock_check.loop_clocks(*synthetic_run(1.0, 1.0), H200)).finding == "not-reproduced"
    assert clock_check.clock_verdict(clock_check.loop_clocks(*synthetic_run(0.95, 1.05), H200)).finding == "mixed"
    lines, samples, reads = synthetic_run(0.908, 1.0)
    assert clock_check.clock_verdict(clock_check.loop_clocks(without_probe(lines), samples, reads, H200)).finding == "undecided"
    assert clock_check.CLOCK_TOLERANCE < (1 - 0.908) / 2  # the two explanations cannot both fit one number


def test_a_probe_that_misreads_the_idle_gpu_decides_nothing():
    lines, samples, reads = synthetic_run(0.908, 1.0, idle_over_nvml=0.95)
    loops = clock_check.loop_clocks(lines, samples, reads, H200)
    verdict = clock_check.clock_verdict(loops, idle_probe=clock_check.idle_probe_over_nvml(lines, reads))
    assert verdict.finding == "uncalibrated" and verdict.decided_by is None


def test_a_probe_that_ends_early_counts_over_the_windows_it_covers():
    # the probe ends 1.85 s into each loop: three of its five windows lie wholly inside it
    lines, samples, reads = synthetic_run(0.908, 1.0, probe_seconds=2.45)
    loops = clock_check.loop_clocks(lines, samples, reads, H200)
    assert all(c.windows == 5 and c.probe_windows == 3 for c in loops)
    gmma = next(c for c in loops if c.path == "gmma")
    assert gmma.probe_over_nvml == pytest.approx(0.908, rel=1e-3)


def test_ncu_cycles_per_kernel_over_its_loop_time_decide_without_the_probe():
    lines, samples, reads = synthetic_run(0.908, 1.0)
    loops = clock_check.loop_clocks(without_probe(lines), samples, reads, H200)
    launches, csv_text, ncu_reads = ncu_run(lines, 0.908)
    kernels = parse_ncu_csv(csv_text)
    ncu = clock_check.ncu_clocks(launches, kernels, ncu_reads)
    assert len(ncu) == 3
    assert all(c.nvml_reads == 201 and c.ncu_over_nvml == pytest.approx(0.908) for c in ncu)
    assert clock_check.loop_cycle_ratios(loops, ncu) == {("bf16", 8192, 8192, 8192): pytest.approx(0.908, rel=1e-3)}
    verdict = clock_check.clock_verdict(loops, ncu)
    assert verdict.finding == "cycles" and verdict.decided_by == "ncu"
    with pytest.raises(UsageError, match="2 launches but ncu profiled 3 kernels"):
        clock_check.ncu_clocks(launches[:2], kernels, ncu_reads)


def test_the_probe_decides_and_ncu_is_reported_beside_it():
    """ncu's isolated launches at another operating point (NVML 1980 MHz) read a lower clock than the
    loop's probe; the probe decides, and ncu's figures stay in the verdict as secondary."""
    lines, samples, reads = synthetic_run(0.908, 1.0)
    loops = clock_check.loop_clocks(lines, samples, reads, H200)
    launches, csv_text, ncu_reads = ncu_run(lines, 0.80)
    ncu = clock_check.ncu_clocks(launches, parse_ncu_csv(csv_text), ncu_reads)
    verdict = clock_check.clock_verdict(loops, ncu, clock_check.idle_probe_over_nvml(lines, reads))
    assert verdict.finding == "cycles" and verdict.decided_by == "probe"
    assert verdict.loop_cycles_over_nvml == pytest.approx(0.80, rel=1e-3)
    assert verdict.ncu_over_nvml == pytest.approx(0.80, rel=1e-3)
    assert verdict.ncu_over_probe is None  # ncu never ran at the loop's own clock (1500 MHz)
    assert "secondary, Nsight Compute" in verdict.describe()


def test_ncu_at_the_loops_own_clock_is_compared_with_the_probe():
    lines, samples, reads = synthetic_run(0.908, 1.0)
    loops = clock_check.loop_clocks(lines, samples, reads, H200)
    launches, csv_text, ncu_reads = ncu_run(lines, 0.92, nvml_mhz=NVML_HZ / 1e6)
    ncu = clock_check.ncu_clocks(launches, parse_ncu_csv(csv_text), ncu_reads)
    assert clock_check.ncu_over_probe_at_the_same_clock(loops, ncu) == {
        ("bf16", 8192, 8192, 8192): pytest.approx(0.92 / 0.908, rel=1e-3)}
    assert clock_check.clock_verdict(loops, ncu).ncu_over_probe == pytest.approx(0.92 / 0.908, rel=1e-3)


def write_jsonl_gz(path: Path, records) -> None:
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))


def write_run(folder: Path, lines, samples, reads) -> None:
    """The files bench/ofu_clock_check.py loop writes."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl_gz(folder / "clock-loop.jsonl.gz", lines)
    write_jsonl_gz(folder / "nvml-clock-loop.jsonl.gz", reads)
    with TraceWriter(folder / "clock-trace.jsonl.gz") as writer:
        for s in samples:
            writer.write([s])


def section(folder: Path) -> report.ClockSection:
    """``bench ofu-report --clock folder``'s rows, read from the files as the report reads them."""
    return report.clock_section(files.read_clock_run(folder), H200)


def test_the_report_reads_the_files_and_gives_the_verdict(tmp_path):
    lines, samples, reads = synthetic_run(0.908, 1.0)
    write_run(tmp_path, lines, samples, reads)
    rows = section(tmp_path)
    assert (len(rows.loops), len(rows.ncu), rows.ncu_left_out) == (2, 0, None)
    bf16 = rows.loops[0]
    c = bf16.clock
    assert (c.precision, c.m, c.n, c.k, c.path, c.windows, c.probe_windows) == ("bf16", 8192, 8192, 8192, "gmma", 5, 5)
    assert [round(x, 3) for x in (c.true_over_nvml, c.probe_over_nvml, c.gpm_over_math)] == [0.908, 0.908, 1.0]
    assert (bf16.ncu_cycles_over_nvml, bf16.ncu_over_probe, c.power_capped_ratio, c.hw_slowdown_ratio) == (None, None, 1.0, 0.0)
    assert (rows.verdict.finding, rows.verdict.decided_by) == ("cycles", "probe")
    assert rows.verdict.describe().startswith("SM cycles elapse slower than NVML reports")
    assert rows.catalog_ratios == {"hmma": 0.903, "dfma": 0.995} and rows.sku_key == "h200-sxm"
    # with the ncu half (bench/ofu_clock_check.py ncu), its CSV gzipped as the committed run's is
    launches, csv_text, ncu_reads = ncu_run(lines, 0.908)
    (tmp_path / "ncu-clock-launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in launches))
    (tmp_path / "ncu-clock.csv.gz").write_bytes(gzip.compress(("==PROF== Connected to process 1\n" + csv_text).encode()))
    write_jsonl_gz(tmp_path / "nvml-clock-ncu.jsonl.gz", ncu_reads)
    rows = section(tmp_path)
    assert (len(rows.loops), len(rows.ncu)) == (2, 3)
    bf16 = rows.loops[0]
    assert round(bf16.ncu_cycles_over_nvml, 3) == 0.908 and bf16.ncu_over_probe is None
    assert (bf16.clock.power_capped_ratio, bf16.clock.hw_slowdown_ratio) == (1.0, 0.0)
    n = rows.ncu[0]
    assert (n.precision, n.m, n.n, n.k, n.path, n.nvml_reads) == ("bf16", 8192, 8192, 8192, "gmma", 201)
    assert round(n.duration_seconds * 1e6, 1) == 1400.0 and round(n.ncu_over_nvml, 3) == 0.908
    assert [round(hz / 1e6) for hz in (n.ncu_sm_clock_hertz, n.nvml_sm_clock_hertz, n.nvml_min_hertz)] == [1798, 1980, 1980]
    # a launch ncu did not profile leaves the ncu half out, and the probe still decides
    (tmp_path / "ncu-clock-launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in launches * 2))
    rows = section(tmp_path)
    assert rows.ncu_left_out.startswith("6 launches but ncu profiled 3 kernels") and rows.ncu == []
    assert (rows.verdict.finding, rows.verdict.decided_by) == ("cycles", "probe")
