"""The clock check on an H200 (bench/ofu_clock_check.py, run by ``bash bench/ofu_h200_check.sh`` on
2026-11-30; its files in tests/data/h200-clock/; docs/validation/ofu.md, "The reference clock").

Steady loops of nine sweep GEMMs ran beside a one-warp probe counting its SM's cycles against the
GPU's timer, GPM in 0.5-s windows and NVML's SM clock read every millisecond; then one launch of
each, three times, under Nsight Compute. On every GMMA loop the probe counts the cycle rate the
loop's FLOP/s need at GPM's busy fraction, 0.885-0.908 × NVML's clock; alone it counts NVML's.
The analysis is unit-tested on hand-made runs in tests/unit/test_clock_check.py.
"""

import gzip
import json
import statistics
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel, tile_from_kernel_name
from kernelfleet.ofu.tiles import corrected_ofu, gemm_flops
from kernelfleet.telemetry.ncu import parse_ncu_csv
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.validation import clock_check, files, report
from kernelfleet.validation.mfu import point_windows

pytestmark = pytest.mark.replay
H200 = Catalog.load().get("h200-sxm")
DATA = Path(__file__).parents[1] / "data"
RECORDED = DATA / "h200-clock"


def read_jsonl(path: Path) -> list:
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def run():
    lines, reads = read_jsonl(RECORDED / "clock-loop.jsonl.gz"), read_jsonl(RECORDED / "nvml-clock-loop.jsonl.gz")
    samples = [b[0] for b in ReplaySource(RECORDED / "clock-trace.jsonl.gz").batches()]
    launches = read_jsonl(RECORDED / "ncu-clock-launches.jsonl")
    kernels = parse_ncu_csv(gzip.decompress((RECORDED / "ncu-clock.csv.gz").read_bytes()).decode())
    return lines, samples, reads, clock_check.ncu_clocks(launches, kernels, read_jsonl(RECORDED / "nvml-clock-ncu.jsonl.gz"))


@pytest.fixture(scope="module")
def loops(run):
    lines, samples, reads, _ = run
    return clock_check.loop_clocks(lines, samples, reads, H200)


@pytest.fixture(scope="module")
def verdict(run, loops):
    lines, _, reads, ncu = run
    return clock_check.clock_verdict(loops, ncu, clock_check.idle_probe_over_nvml(lines, reads))


def test_every_point_ran_with_windows_probe_and_dense_reads(run, loops):
    lines = run[0]
    assert not [line for line in lines if "error" in line]
    assert len(loops) == 9 and all(c.windows >= 4 and c.probe_windows >= 3 for c in loops)
    assert {c.path: sum(x.path == c.path for x in loops) for c in loops} == {"gmma": 7, "mma.sync": 1, "dmma": 1}
    assert all(c.power_capped_ratio is not None and c.hw_slowdown_ratio == 0 for c in loops)  # the reasons were read
    # no probe waited for Triton to compile at its launch: its timer maps to wall time from there
    probes = [line["probe"] for line in lines if "probe" in line]
    assert len(probes) == 11 and all(p["launch_returned_wall"] - p["launch_wall"] < 0.005 for p in probes)
    # the fp64 loop outlasted the probe's budget: three of its six windows lie wholly inside the probe
    (fp64,) = [c for c in loops if c.path == "dmma"]
    assert (fp64.windows, fp64.probe_windows) == (6, 3)


def test_the_probe_alone_counts_the_cycles_nvmls_clock_implies(run):
    lines, _, reads, _ = run
    assert clock_check.idle_probe_over_nvml(lines, reads) == pytest.approx(1.0, abs=0.001)


def test_on_every_gmma_loop_the_probe_counts_the_clock_the_flops_need(loops):
    """GPM's busy fraction is the fraction the math needs at the probe's cycle rate: GPM is right,
    NVML's clock is not the rate SM cycles elapse at."""
    gmma = [c for c in loops if c.path == "gmma"]
    assert all(0.88 < c.probe_over_nvml < 0.91 for c in gmma)
    assert all(c.gpm_over_math == pytest.approx(1.0, abs=0.005) for c in gmma)
    assert statistics.median(c.probe_over_nvml for c in gmma) == pytest.approx(0.903, abs=5e-4)
    assert statistics.median(c.true_over_nvml for c in gmma) == pytest.approx(0.905, abs=5e-4)
    # capped (NVML 1379-1650 MHz) and uncapped (1980 MHz, bf16 1024^3) alike
    uncapped = [c for c in gmma if c.power_capped_ratio == 0]
    assert [(c.precision, c.m) for c in uncapped] == [("bf16", 1024)] and uncapped[0].probe_over_nvml < 0.9


def test_the_mma_sync_loop_runs_the_same_clock_at_two_thirds_the_rate_per_cycle(loops):
    (tf32,) = [c for c in loops if c.path == "mma.sync"]
    assert tf32.flops_per_active_cycle == pytest.approx(4096 / 3)
    assert tf32.probe_over_nvml == pytest.approx(0.907, abs=0.001)
    assert tf32.gpm_over_math == pytest.approx(1.0, abs=0.005)
    # at the warpgroup rate (2048) the loop would have needed 0.61 x NVML's clock
    assert tf32.true_over_nvml * 2 / 3 == pytest.approx(0.606, abs=0.001)


def test_dmma_runs_at_nvmls_clock(loops):
    (fp64,) = [c for c in loops if c.path == "dmma"]
    assert fp64.true_over_nvml == pytest.approx(0.998, abs=0.001)
    assert fp64.probe_over_nvml == pytest.approx(0.995, abs=0.001)


def test_the_catalog_ratio_is_the_probes(verdict):
    assert H200.tensor_clock_ratio == {"hmma": round(verdict.probe_over_nvml, 3),
                                       "dfma": round(verdict.dmma_probe_over_nvml, 3)}


def test_every_launch_under_ncu_is_paired_and_read_by_nvml(run):
    ncu = run[3]
    assert len(ncu) == 9 * 3 and all(c.nvml_reads > 0 for c in ncu)
    # isolated, at NVML's 1980 MHz: large GMMA kernels 0.75-0.83, tiny ones ~0.90, DMMA 0.935-0.97
    large = [c.ncu_over_nvml for c in ncu if c.path == "gmma" and c.duration_seconds > 1e-4]
    assert len(large) == 18 and 0.74 < min(large) and max(large) < 0.84
    assert all(0.89 < c.ncu_over_nvml < 0.92 for c in ncu if c.duration_seconds < 1e-5)
    assert all(0.93 < c.ncu_over_nvml < 0.98 for c in ncu if c.path == "dmma")


def test_ncu_at_the_loops_own_clock_agrees_with_the_probe(run, loops):
    ratios = clock_check.ncu_over_probe_at_the_same_clock(loops, run[3])
    assert set(ratios) == {("bf16", 1024, 1024, 1024), ("tf32", 512, 512, 512)}  # the loops NVML read at 1980
    assert all(r == pytest.approx(1.0, abs=0.015) for r in ratios.values())


def test_the_verdict_is_cycles_decided_by_the_probe(verdict):
    assert verdict.finding == "cycles" and verdict.decided_by == "probe", verdict.describe()
    assert verdict.true_over_nvml == pytest.approx(0.905, abs=5e-4)
    assert verdict.probe_over_nvml == pytest.approx(0.903, abs=5e-4)
    assert verdict.gpm_over_math == pytest.approx(0.998, abs=5e-4)
    # secondary, beside it: ncu's cycles per kernel in the loop and isolated launches read lower still
    assert verdict.loop_cycles_over_nvml == pytest.approx(0.848, abs=5e-4)
    assert verdict.ncu_over_nvml == pytest.approx(0.787, abs=5e-4)
    assert verdict.ncu_over_probe == pytest.approx(1.011, abs=5e-4)


def test_the_reports_clock_section_reads_the_folder():
    """``bench ofu-report --clock``'s rows, from the files as the report finds them."""
    section = report.clock_section(files.read_clock_run(RECORDED), H200)
    assert (section.verdict.finding, section.verdict.decided_by) == ("cycles", "probe")
    assert section.verdict.describe().startswith("SM cycles elapse slower than NVML reports")
    assert section.ncu_left_out is None and section.catalog_ratios == {"hmma": 0.903, "dfma": 0.995}
    bf16 = next(r.clock for r in section.loops if (r.clock.precision, r.clock.m) == ("bf16", 8192))
    assert (bf16.path, bf16.windows, bf16.probe_windows) == ("gmma", 4, 4)
    assert [round(x, 3) for x in (bf16.mfu_ratio, bf16.gpm_tensor_active_ratio, bf16.true_over_nvml, bf16.probe_over_nvml,
                                  bf16.gpm_over_math)] == [0.641, 0.864, 0.905, 0.902, 0.998]
    assert [round(hz / 1e6) for hz in (bf16.nvml_sm_clock_hertz, bf16.implied_sm_clock_hertz,
                                       bf16.probe_sm_clock_hertz)] == [1525, 1379, 1376]


DUTY = DATA / "h200-clock-duty"


@pytest.fixture(scope="module")
def duty():
    """``bench/ofu_clock_check.py duty``: bf16 8192³ loops with 0, 1, 3 and 9 in-place adds (each a
    third of a GEMM's time) after every GEMM, beside the probe, GPM and 1-ms NVML reads."""
    lines, reads = read_jsonl(DUTY / "clock-loop.jsonl.gz"), read_jsonl(DUTY / "nvml-clock-loop.jsonl.gz")
    samples = [b[0] for b in ReplaySource(DUTY / "clock-trace.jsonl.gz").batches()]
    return lines, samples, reads, clock_check.loop_clocks(lines, samples, reads, H200)


def test_between_gemms_the_sm_clock_stays_where_it_is_during_them(duty):
    """The probe averages its SM's cycle rate over whole windows, adds included; f_true is the rate
    the GEMMs' FLOPs need while the tensor pipes are busy. They agree within 0.4 % at every duty
    cycle, from 86 % of the time busy down to 20 %: the clock does not rise to NVML's between the
    GEMMs, so a window is not a mix of 0.9 × NVML (GEMMs) and NVML (the rest)."""
    lines, _, reads, loops = duty
    assert [c.filler_launches for c in loops] == [0, 1, 3, 9]
    assert clock_check.idle_probe_over_nvml(lines, reads) == pytest.approx(1.0, abs=0.002)
    active = [c.gpm_tensor_active_ratio for c in loops]
    assert active == sorted(active, reverse=True) and active[0] > 0.85 and active[-1] < 0.2
    for c in loops:
        assert c.gpm_over_math == pytest.approx(1.0, abs=0.004)
        mixed = 1 - (1 - loops[0].probe_over_nvml) * c.gpm_tensor_active_ratio / loops[0].gpm_tensor_active_ratio
        if c.filler_launches >= 3:  # what a mix would read, far from what the probe counts
            assert mixed - c.probe_over_nvml > 0.025


def test_the_clock_ratio_moves_with_the_load_not_with_tensor_activity(duty):
    """0.906 with only GEMMs (power-capped), 0.911 with three adds (41 % busy, still capped), 0.952
    with nine (20 % busy, 540 W, NVML at its 1980-MHz top): the 0.903 the catalog keeps fits GEMM-bound
    loads, and a job whose GPU is less loaded reads OFU low by up to ~5 % of its value."""
    loops = duty[3]
    ratio = {c.filler_launches: c.probe_over_nvml for c in loops}
    assert ratio[0] == pytest.approx(0.906, abs=0.005) and ratio[3] == pytest.approx(0.911, abs=0.005)
    assert ratio[9] == pytest.approx(0.952, abs=0.005)
    nine = next(c for c in loops if c.filler_launches == 9)
    assert nine.power_capped_ratio == 0 and nine.nvml_sm_clock_hertz == pytest.approx(1980e6, rel=0.001)


def test_what_ofu_reads_at_partial_duty(duty):
    """OFU as the agent computes it (tile-corrected, f_ref 2027 MHz) against the loops' MFU: within
    0.4 pp where the clock ratio is the catalog's; 1.1 pp low with nine adds (ratio 0.952); 1.7 pp
    low with one add, whose NVML window means swung 1588-1674 MHz while the probe held 1520-1539."""
    lines, samples, _, _ = duty
    error = {}
    for p in lines:
        if p.get("idle"):
            continue
        windows = point_windows(p, samples, H200)
        kernel = next(name for name in p["kernels"] if tile_from_kernel_name(name))
        mfu, raw = statistics.mean(w[1] for w in windows), statistics.mean(w[2] for w in windows)
        ofu = corrected_ofu(raw, gemm_flops(p["m"], p["n"], p["k"]), executed_flops_of_kernel(p["m"], p["n"], p["k"], kernel))
        error[p["filler_launches"]] = round(100 * (ofu - mfu), 1)
    assert error == {0: -0.2, 1: -1.7, 3: -0.4, 9: -1.1}
