"""Counters per device profile (profile/counters.py, groups.py), the census by class, on the CPU.

FORMAT FIXTURE: the ncu CSV below is written by :func:`ncu_csv` in the exact format of a real
``ncu --csv`` run (header, quoting, thousands separators and units copied from
tests/data/h200-sweep/ncu-sweep.csv.gz), but its values are made up, and the NVTX column of
*nested* ranges is our reading of ncu's format (the sweep had one range). It stands in until
``bench/profile_counters.sh`` has run on the H200; its recorded CSV then replaces it (replay test).
"""

import json
import sys

import pytest

from kernelfleet.cli import main
from kernelfleet.errors import UsageError
from kernelfleet.plan.model import CostTable
from kernelfleet.profile.counters import LATENCY_PCT, classify, launch_classes, parse_counters, same_kernel, seen
from kernelfleet.profile.groups import Group, Groups
from kernelfleet.profile.table import preference_by_class

pytestmark = pytest.mark.unit

HEADER = ('"ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:'
          'Color:Msg_Type:Msg","Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",'
          '"Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
          '"Metric Unit","Metric Value"')
GEMM, ADD, SUM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "_ZN2at6native29vectorized_add", "_ZN2at6native13reduce_sum"
PROFILES = {"whole": {"sms": None, "device_sms": 132, "copy_bytes_per_second": 4.2e12},
            "compute": {"sms": 56, "device_sms": 132, "copy_bytes_per_second": 3.36e12},
            "bandwidth": {"sms": 32, "device_sms": 132, "copy_bytes_per_second": 2.1e12}}


def make_groups(launched=("g0", "g1", "g3")) -> Groups:
    """Six launches: a GEMM (0, 3), an add (1, 4), a memset (2), a reduction (5)."""
    return Groups("toy", 6, [
        Group("g0", "kernel", GEMM, (2, 66, 1), (384, 1, 1), 213188, (0, 3)),
        Group("g1", "kernel", ADD, (64, 1, 1), (128, 1, 1), 0, (1, 4)),
        Group("g2", "memset", "memset", None, None, 0, (2,)),
        Group("g3", "kernel", SUM, (1, 1, 1), (512, 1, 1), 0, (5,)),
    ], PROFILES, {p: list(launched) for p in PROFILES})


def metrics(duration_ns, sm, memory, tensor_ratio, active_cycles=10_000.0, dram_mbytes=None):
    """ncu metric rows of one kernel: (name, unit, value)."""
    rows = [("dram__bytes_read.sum", "Mbyte" if dram_mbytes else "byte", dram_mbytes or 1_048_576),
            ("dram__bytes_write.sum", "byte", 524_288),
            ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%", memory),
            ("gpu__time_duration.sum", "ns", duration_ns),
            ("sm__cycles_active.avg", "cycle", active_cycles),
            ("sm__pipe_tensor_cycles_active.sum", "cycle", tensor_ratio * 4 * 132 * active_cycles),
            ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", sm),
            ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", 40.5)]
    return rows


def ncu_csv(kernels, nvtx=None) -> str:
    """FORMAT FIXTURE (module docstring): ``kernels`` = [(profile, group, name, grid, block, metric rows)]."""
    lines = ["==PROF== Connected to process 676 (/usr/bin/python3.12)", "ncu_run: a stray line on stdout", HEADER]
    for n, (profile, group, name, grid, block, rows) in enumerate(kernels):
        stack = nvtx(profile, group) if nvtx else " ".join(
            f'""<default domain>:{label}:none:none:none:none:none:none""' for label in ("counters", profile, group))
        for metric, unit, value in rows:
            text = f"{value:,.2f}" if isinstance(value, float) and not value.is_integer() else f"{int(value):,}"
            lines.append(f'"{n}","676","python3.12","127.0.0.1","676  {stack} ","","{name}","1","7",'
                         f'"({block[0]}, {block[1]}, {block[2]})","({grid[0]}, {grid[1]}, {grid[2]})","0","9.0",'
                         f'"Command line profiler metrics","{metric}","{unit}","{text}"')
    lines.append("==PROF== Disconnected from process 676")
    return "\n".join(lines) + "\n"


GEMM_ROWS = ((2, 66, 1), (384, 1, 1))
ADD_ROWS = ((64, 1, 1), (128, 1, 1))
SUM_ROWS = ((1, 1, 1), (512, 1, 1))


def fixture_kernels():
    """Whole GPU: GEMM tensor-bound, add memory-bound, reduction latency-bound. Bandwidth (32 SMs):
    the same kernels at the whole-GPU percentages a 32-SM partition can reach. Compute: no reduction."""
    return [
        ("whole", "g0", GEMM, *GEMM_ROWS, metrics(300_000, 85.0, 40.0, 0.9)),
        ("whole", "g1", ADD, *ADD_ROWS, metrics(4_000, 20.0, 85.0, 0.0)),
        ("whole", "g3", SUM, *SUM_ROWS, metrics(3_000, 10.0, 15.0, 0.0)),
        ("compute", "g0", GEMM, *GEMM_ROWS, metrics(600_000, 36.0, 20.0, 0.9)),
        ("compute", "g1", ADD, *ADD_ROWS, metrics(5_000, 9.0, 70.0, 0.0)),
        ("bandwidth", "g0", GEMM, *GEMM_ROWS, metrics(900_000, 20.6, 12.0, 0.88, dram_mbytes=2.5)),
        ("bandwidth", "g1", ADD, *ADD_ROWS, metrics(6_000, 5.0, 45.0, 0.0)),
        ("bandwidth", "g3", SUM, *SUM_ROWS, metrics(3_100, 2.0, 8.0, 0.0)),
    ]


def test_the_thresholds():
    assert classify(LATENCY_PCT - 0.1, LATENCY_PCT - 0.1, 0.99) == "latency"
    assert classify(60.0, 59.0, 0.9) == "tensor"
    assert classify(60.0, 59.0, 0.49) == "compute"
    assert classify(60.0, 59.0, None) == "compute"  # tensor pipe not counted: not claimed
    assert classify(70.0, 70.0, 0.9) == "memory"  # a tie goes to memory, as ncu's rule reads it
    assert classify(10.0, 95.0, 0.0) == "memory"
    assert classify(None, 95.0, 0.0) is None


def test_parse_joins_rows_to_groups_and_profiles():
    rows = {(r.profile, r.group): r for r in parse_counters(ncu_csv(fixture_kernels()), make_groups())}
    assert len(rows) == 8
    gemm = rows["whole", "g0"]
    assert gemm.duration_seconds == pytest.approx(300e-6)
    assert gemm.dram_bytes == 1_048_576 + 524_288
    assert gemm.tensor_active_ratio == pytest.approx(0.9)
    assert gemm.warps_active_pct == 40.5 and gemm.sm_pct == 85.0 and gemm.memory_pct == 40.0
    assert rows["bandwidth", "g0"].dram_bytes == 2_500_000 + 524_288  # a scaled unit, in bytes


def test_partition_percentages_are_of_the_profiles_own_peak():
    rows = {(r.profile, r.group): r for r in parse_counters(ncu_csv(fixture_kernels()), make_groups())}
    gemm = rows["bandwidth", "g0"]
    assert gemm.sm_share == pytest.approx(32 / 132) and gemm.memory_share == pytest.approx(0.5)
    assert gemm.sm_pct_of_profile == pytest.approx(20.6 * 132 / 32)  # 85 %
    assert classify(gemm.sm_pct, gemm.memory_pct, gemm.tensor_active_ratio) == "latency"  # read raw, it would be
    assert gemm.kind == "tensor"
    assert rows["bandwidth", "g1"].memory_pct_of_profile == pytest.approx(90.0) and rows["bandwidth", "g1"].kind == "memory"
    assert rows["compute", "g1"].memory_pct_of_profile == pytest.approx(87.5)
    assert rows["whole", "g1"].memory_share == 1.0 and rows["whole", "g1"].kind == "memory"
    assert [rows[p, "g3"].kind for p in ("whole", "bandwidth")] == ["latency", "latency"]
    assert rows["compute", "g0"].sm_pct_of_profile == pytest.approx(36.0 * 132 / 56)


def test_what_ncu_returned_per_profile_and_the_class_of_every_launch():
    groups = make_groups()
    rows = parse_counters(ncu_csv(fixture_kernels()), groups)
    assert seen(rows, groups) == {"whole": (3, 3), "compute": (2, 3), "bandwidth": (3, 3)}
    assert launch_classes(rows, groups, "whole") == ["tensor", "memory", "memset", "tensor", "memory", "latency"]
    assert launch_classes(rows, groups, "compute")[5] == "no counters"


def test_a_partition_ncu_did_not_see_is_reported_not_invented():
    groups = make_groups()
    rows = parse_counters(ncu_csv([k for k in fixture_kernels() if k[0] == "whole"]), groups)
    assert seen(rows, groups) == {"whole": (3, 3), "compute": (0, 3), "bandwidth": (0, 3)}
    assert set(launch_classes(rows, groups, "bandwidth")) == {"no counters", "memset"}


def test_nvtx_ranges_written_as_one_path_are_read_too():
    text = ncu_csv(fixture_kernels()[:1], nvtx=lambda p, g: f'""<default domain>:counters/{p}/{g}:none""')
    assert [(r.profile, r.group) for r in parse_counters(text, make_groups())] == [("whole", "g0")]


@pytest.mark.parametrize("break_it, needle", [
    (lambda t: t.replace('"thread Domain:Push/Pop_Range', '"thread Domain:Other'), "run ncu with --nvtx"),
    (lambda t: t.replace('"Metric Name"', '"Metric"'), "expected columns"),
    (lambda t: t.replace(":g3:", ":g9:"), "name no profile"),
    (lambda t: t.replace("counters", "sweep"), "outside the NVTX range 'counters'"),
    (lambda t: t.replace('"(1, 1, 1)"', '"(2, 1, 1)"'), "different runs"),
    (lambda t: t.replace(SUM, "some_other_kernel"), "different runs"),
    (lambda t: t.replace('"Mbyte"', '"Pbyte"'), "dram__bytes_read.sum in unit 'Pbyte'"),
    (lambda t: t.replace('"ns"', '"cycle"'), "gpu__time_duration.sum in unit 'cycle'"),
    (lambda t: t.split(HEADER)[0], "no \"ID\" header"),
])
def test_bad_csv_is_a_usage_error(break_it, needle):
    with pytest.raises(UsageError) as caught:
        parse_counters(break_it(ncu_csv(fixture_kernels())), make_groups())
    assert needle in str(caught.value), str(caught.value)


def test_kernel_names_mangled_or_not():
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
    assert same_kernel(mangled, mangled) and same_kernel(mangled, mangled[:40])
    assert same_kernel(mangled, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                                "std::array<char *, 1>>(int, T2, T3)")
    assert not same_kernel(mangled, "void at::native::reduce_kernel<512, 1>(T3)")
    assert same_kernel("_ZN2at6native54_GLOBAL__N__3e2c1b5f_20_layer_norm_kernel_cu_abc16vectorized_layer_norm_kernelIfEEvT_",
                       "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>(int)")
    assert not same_kernel(mangled, "void at::native::(anonymous namespace)::")
    assert same_kernel(GEMM, GEMM) and not same_kernel(GEMM, "nvjet_sm90_tst_64x8_64x16_1x2_h_bz_NNT")


def test_a_kernel_profiled_twice_is_refused():
    kernels = fixture_kernels()
    with pytest.raises(UsageError, match="profiled twice"):
        parse_counters(ncu_csv(kernels + kernels[:1]), make_groups())


def test_groups_must_cover_every_launch_once_and_survive_json():
    groups = make_groups()
    again = Groups.from_json(groups.to_json())
    assert again == groups and again.by_id()["g0"].representative == 0
    with pytest.raises(UsageError, match="exactly once"):
        Groups("toy", 7, groups.groups)
    with pytest.raises(UsageError, match="unknown groups"):
        Groups("toy", 6, groups.groups, launched={"whole": ["g7"]})
    with pytest.raises(UsageError, match="expected kernelfleet_counter_groups=1"):
        Groups.from_json(json.dumps({"step": "toy"}))


def table() -> CostTable:
    """Seconds on (compute, bandwidth), launch by launch: 212 µs against 307 µs, bandwidth the weaker;
    it runs launches 1, 4 and 5 faster (2 + 3 + 6 = 11 µs of compute's time)."""
    rows = [(100e-6, 150e-6), (2e-6, 1e-6), (1e-6, 1e-6), (100e-6, 150e-6), (3e-6, 1e-6), (6e-6, 4e-6)]
    return CostTable([{"compute": c, "bandwidth": b, "whole": c / 3} for c, b in rows], "toy")


def test_census_by_class_adds_up_to_the_census():
    overall, by_class = preference_by_class(table(), "compute", "bandwidth",
                                            ["tensor", "memory", "memset", "tensor", "memory", "latency"])
    assert overall.weaker == "bandwidth" and overall.kernels_faster_on_weaker == 3
    assert overall.stronger_total_seconds == pytest.approx(212e-6)
    assert overall.seconds_faster_on_weaker == pytest.approx(11e-6)
    c = {x.kind: x for x in by_class}
    assert [x.kind for x in by_class] == ["tensor", "latency", "memory", "memset"]  # by time on the stronger
    assert (c["tensor"].kernels, c["tensor"].kernels_faster_on_weaker) == (2, 0)
    assert c["memory"].kernels_faster_on_weaker == 2 and c["memory"].share_faster_of_time == pytest.approx(1.0)
    assert c["memory"].share_of_time(overall) == pytest.approx(5e-6 / 212e-6)
    assert (c["latency"].kernels_faster_on_weaker, c["latency"].weaker_seconds) == (1, pytest.approx(4e-6))
    assert c["memset"].kernels_faster_on_weaker == 0  # equal times are not faster
    assert sum(x.stronger_seconds for x in by_class) == pytest.approx(overall.stronger_total_seconds)
    assert sum(x.seconds_faster_on_weaker for x in by_class) == pytest.approx(overall.seconds_faster_on_weaker)
    with pytest.raises(UsageError, match="5 classes for a cost table of 6"):
        preference_by_class(table(), "compute", "bandwidth", ["tensor"] * 5)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "costs.json").write_text(table().to_json())
    (tmp_path / "toy.groups.json").write_text(make_groups().to_json())
    (tmp_path / "toy.ncu.csv").write_text(ncu_csv(fixture_kernels()))
    return tmp_path


def census(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "census", *map(str, args)])
    try:
        main()
    except SystemExit as stop:
        return stop.code, capsys.readouterr()
    return 0, capsys.readouterr()


def test_census_prints_the_classes(files, monkeypatch, capsys):
    code, out = census(monkeypatch, capsys, files / "costs.json", "--counters", files / "toy.ncu.csv")
    assert code == 0, out.err
    text = out.out
    assert "bandwidth is slower overall (0.31 ms vs 0.21 ms), yet 3 of 6 kernels (50%; 5% of compute's time)" in text
    assert "whole 3 of 3, compute 2 of 3, bandwidth 3 of 3; classes from whole" in text
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    assert cells == [["tensor", "2", "94%", "0 (0%)", "0%"], ["latency", "1", "3%", "1 (100%)", "100%"],
                     ["memory", "2", "2%", "2 (100%)", "100%"], ["memset", "1", "0%", "0 (0%)", "0%"]]
    code, out = census(monkeypatch, capsys, files / "costs.json", "--counters", files / "toy.ncu.csv",
                       "--class-on", "bandwidth")
    assert code == 0 and "classes from bandwidth" in out.out


@pytest.mark.parametrize("args, needle", [
    (("--counters", "none.ncu.csv"), "none.ncu.csv: cannot read"),
    (("--counters", "toy.csv"), "give --groups too"),
    (("--counters", "bad.ncu.csv", "--groups", "toy.groups.json"), "expected columns"),
    (("--counters", "toy.ncu.csv", "--groups", "seven.groups.json"), "7 launches, the cost table has 6"),
    (("--counters", "toy.ncu.csv", "--class-on", "h100"), "ncu returned counters for whole, compute, bandwidth only"),
    (("--between", "compute,h100"), "--between: need two of the table's profiles"),
])
def test_census_bad_input_is_one_line(files, monkeypatch, capsys, args, needle):
    (files / "toy.csv").write_text(ncu_csv(fixture_kernels()))
    (files / "bad.ncu.csv").write_text(ncu_csv(fixture_kernels()).replace('"Metric Value"', '"Value"'))
    toy = make_groups()
    seven = Groups("toy", 7, toy.groups[:3] + [Group("g3", "kernel", SUM, (1, 1, 1), (512, 1, 1), 0, (5, 6))],
                   toy.profiles, toy.launched)
    (files / "seven.groups.json").write_text(seven.to_json())
    code, out = census(monkeypatch, capsys, files / "costs.json", *[files / a if a.endswith((".csv", ".json")) else a
                                                                      for a in args])
    assert code == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and "Traceback" not in out.err, out.err
    assert needle in lines[0], lines[0]


def test_the_pipeline_on_a_real_program_and_cost_table():
    """The real llama8b-decode program's 50 groups (real mangled names, grids, blocks) and its
    measured cost table, with FORMAT FIXTURE counters on the whole GPU: every nvjet GEMM tensor-bound,
    everything else memory-bound."""
    from pathlib import Path

    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.raw import RawCapture
    from kernelfleet.profile.groups import group_launches
    from kernelfleet.profile.table import load_seconds

    data = Path(__file__).parents[1] / "data" / "h200-capture"
    program = assemble(RawCapture.load(data / "llama8b-decode.profiled-capture.json.gz"))
    groups = Groups("llama8b-decode", len(program.launches), group_launches(program),
                    {"whole": PROFILES["whole"]}, {"whole": []})
    kernels = [g for g in groups.groups if g.kind == "kernel"]
    groups.launched["whole"] = [g.id for g in kernels]
    text = ncu_csv([("whole", g.id, g.name, g.grid, g.block,
                     metrics(10_000, 80.0, 30.0, 0.9) if "nvjet" in g.name else metrics(2_000, 10.0, 75.0, 0.0))
                    for g in kernels])
    rows = parse_counters(text, groups)
    assert len(rows) == len(kernels) == 49  # the 50th group is the step's one memset
    kinds = launch_classes(rows, groups, "whole")
    gemms = sum("nvjet" in launch.name for launch in program.launches)
    assert kinds.count("tensor") == gemms and kinds.count("memset") == 1
    assert kinds.count("memory") == len(program.launches) - gemms - 1
    overall, by_class = preference_by_class(load_seconds(data / "llama8b-decode.profile.json"), "compute",
                                            "bandwidth", kinds)
    assert (overall.kernels, overall.kernels_faster_on_weaker) == (1975, 1842)  # the census of docs/place.md
    assert sum(c.kernels_faster_on_weaker for c in by_class) == 1842
