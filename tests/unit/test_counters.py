"""Counters per device profile (profile/counters.py, groups.py), the census by class, on the CPU.

The rules are tested on hand-built numbers and objects; the parser on the CSV ncu wrote on the
H200 (tests/data/h200-counters, ``bench/profile_counters.sh``), broken on purpose where a test
needs bad input. What that run found is pinned in tests/replay/test_counters_h200.py.
"""

import gzip
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from kernelfleet.cli import main
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.profile.counters import (
    LATENCY_PCT,
    KernelCounters,
    classify,
    function_name,
    launch_classes,
    load_counters,
    parse_counters,
    same_kernel,
    seen,
)
from kernelfleet.profile.groups import Group, Groups
from kernelfleet.profile.table import preference_by_class

pytestmark = pytest.mark.unit

DATA = Path(__file__).parents[1] / "data"
COUNTERS = DATA / "h200-counters"
GEMM, ADD, SUM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "_ZN2at6native29vectorized_add", "_ZN2at6native13reduce_sum"
PROFILES = {"whole": {"sms": None, "device_sms": 132, "copy_bytes_per_second": 4.2e12},
            "compute": {"sms": 56, "device_sms": 132, "copy_bytes_per_second": 3.36e12},
            "bandwidth": {"sms": 32, "device_sms": 132, "copy_bytes_per_second": 2.1e12}}
# One kernel as the capture recorded it (mangled) and as ncu printed it (row ID 45 of
# llama8b-prefill.ncu.csv, group g23): the pair the first census refused.
CAT_MANGLED = ("_ZN2at6native40_GLOBAL__N__0f1a8107_8_Shape_cu_49f7391c30CatArrayBatchedCopy_vectorizedINS1_10Opaque"
               "TypeILj4EEEjLi4ELi128ELi1ELi16ELi4EEEvPcNS1_25CatArrInputTensorMetadataIT_T0_XT2_EXT3_EEENS1_16Tensor"
               "SizeStrideIS8_Lj4EEEiS8_")
CAT_NCU = ("void at::<unnamed>::CatArrayBatchedCopy_vectorized<at::<unnamed>::OpaqueType<4>, unsigned int, 4, 128, 1, "
           "16, 4>(char *, at::<unnamed>::CatArrInputTensorMetadata<T1, T2, T4, T5>, at::<unnamed>::TensorSizeStride"
           "<T2, 4>, int, T2)")


def make_groups(launched=("g0", "g1", "g3")) -> Groups:
    """Six launches: a GEMM (0, 3), an add (1, 4), a memset (2), a reduction (5)."""
    return Groups("toy", 6, [
        Group("g0", "kernel", GEMM, (2, 66, 1), (384, 1, 1), 213188, (0, 3)),
        Group("g1", "kernel", ADD, (64, 1, 1), (128, 1, 1), 0, (1, 4)),
        Group("g2", "memset", "memset", None, None, 0, (2,)),
        Group("g3", "kernel", SUM, (1, 1, 1), (512, 1, 1), 0, (5,)),
    ], PROFILES, {p: list(launched) for p in PROFILES})


def counters(profile, group, sm, memory, tensor=0.0, memory_share=1.0) -> KernelCounters:
    return KernelCounters(profile, group, "k", 1e-5, sm, memory, memory, 1e6, 2e6, tensor, 50.0, memory_share)


def real(step="llama8b-prefill") -> tuple[str, Groups]:
    """The CSV and groups file of one step of the H200 counters run."""
    return (gzip.decompress((COUNTERS / f"{step}.ncu.csv.gz").read_bytes()).decode(),
            Groups.load(COUNTERS / f"{step}.groups.json"))


def test_the_thresholds():
    assert classify(LATENCY_PCT - 0.1, LATENCY_PCT - 0.1, 0.99) == "latency"
    assert classify(60.0, 59.0, 0.9) == "tensor"
    assert classify(60.0, 59.0, 0.49) == "compute"
    assert classify(60.0, 59.0, None) == "compute"  # tensor pipe not counted: not claimed
    assert classify(70.0, 70.0, 0.9) == "memory"  # a tie goes to memory, as ncu's rule reads it
    assert classify(10.0, 95.0, 0.0) == "memory"
    assert classify(None, 95.0, 0.0) is None


def test_on_a_partition_sm_throughput_is_taken_as_is_and_memory_over_the_partitions_reach():
    """ncu gives SM throughput of the partition's own SMs and DRAM of the whole GPU's (module docstring)."""
    gemv = counters("bandwidth", "g0", sm=25.1, memory=47.9, memory_share=2.1 / 4.2)
    assert gemv.memory_pct_of_profile == pytest.approx(95.8) and gemv.kind == "memory"
    copy = counters("bandwidth", "g1", sm=82.3, memory=7.0, memory_share=0.5)
    assert copy.memory_pct_of_profile == pytest.approx(14.0) and copy.kind == "compute"
    assert counters("bandwidth", "g2", sm=20.0, memory=64.0, memory_share=0.5).memory_pct_of_profile == 100.0
    assert counters("whole", "g3", sm=5.0, memory=30.0).kind == "latency"


def test_the_class_of_every_launch():
    groups = make_groups()
    rows = [counters("whole", "g0", 90.0, 70.0, tensor=0.98), counters("whole", "g1", 10.0, 80.0),
            counters("whole", "g3", 1.0, 2.0), counters("compute", "g0", 85.0, 30.0, tensor=0.97)]
    assert seen(rows, groups) == {"whole": (3, 3), "compute": (1, 3), "bandwidth": (0, 3)}
    assert launch_classes(rows, groups, "whole") == ["tensor", "memory", "memset", "tensor", "memory", "latency"]
    assert launch_classes(rows, groups, "compute") == ["tensor", "no counters", "memset", "tensor", "no counters",
                                                       "no counters"]
    assert set(launch_classes(rows, groups, "bandwidth")) == {"no counters", "memset"}  # reported, not invented


def test_kernel_names_mangled_or_not():
    assert same_kernel(CAT_MANGLED, CAT_NCU)  # ncu's <unnamed>, without at::native, against _GLOBAL__N__
    assert function_name(CAT_NCU) == "CatArrayBatchedCopy_vectorized"
    fill = "_ZN2at6native29vectorized_elementwise_kernelILi8ENS0_11FillFunctorIN3c108BFloat16EEESt5arrayIPcLm1EEEEviT0_T1_"
    assert same_kernel(fill, "void at::vectorized_elementwise_kernel<8, at::FillFunctor<c10::BFloat16>, "
                             "std::array<char *, 1>>(int, T2, T3)")
    assert not same_kernel(fill, "void at::reduce_kernel<512, 1, at::ReduceOp<float, at::MeanOps<float, float, "
                                 "float, float>, unsigned int, float, 4, 4>>(T3)")
    assert not same_kernel(CAT_MANGLED, "void at::<unnamed>::CatArrayBatchedCopy<at::<unnamed>::OpaqueType<4>>(int)")
    assert not same_kernel(fill, "void at::<unnamed>::")  # no function name left
    assert function_name("void at::elementwise_kernel<128, 4, void at::gpu_kernel_impl_nocast<at::direct_copy_"
                         "kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() const>(int, "
                         "T3)") == "elementwise_kernel"
    assert same_kernel(GEMM, GEMM) and not same_kernel(GEMM, "nvjet_sm90_tst_64x16_64x16_2x1_v_bz_TNT")


def test_the_real_csv_is_read_row_by_row():
    text, groups = real()
    rows = {(r.profile, r.group): r for r in parse_counters(text, groups)}
    assert len(rows) == 3 * 32
    gemm = rows["whole", "g38"]  # row ID 0: 300,964,096 + 11,039,232 DRAM bytes, 265,024 ns
    assert gemm.kernel == GEMM and gemm.duration_seconds == pytest.approx(265_024e-9)
    assert gemm.dram_bytes == 300_964_096 + 11_039_232 and gemm.memory_pct == 71.80 and gemm.dram_pct == 24.47
    assert rows["whole", "g23"].kernel == CAT_NCU
    assert rows["bandwidth", "g38"].memory_share == pytest.approx(groups.profiles["bandwidth"]["copy_bytes_per_second"]
                                                                  / groups.profiles["whole"]["copy_bytes_per_second"])


def test_a_gzipped_csv_reads_as_the_plain_one(tmp_path):
    text, groups = real("llama8b-decode")
    (tmp_path / "d.ncu.csv").write_text(text)
    assert load_counters(tmp_path / "d.ncu.csv", groups) == load_counters(COUNTERS / "llama8b-decode.ncu.csv.gz", groups)
    (tmp_path / "cut.ncu.csv.gz").write_bytes((COUNTERS / "llama8b-decode.ncu.csv.gz").read_bytes()[:5000])
    with pytest.raises(UsageError, match="cut.ncu.csv.gz: not an ncu CSV"):
        load_counters(tmp_path / "cut.ncu.csv.gz", groups)


def twice(text: str) -> str:
    """The rows of row ID 0 once more, as row ID 9999."""
    again = [line.replace('"0",', '"9999",', 1) for line in text.splitlines() if line.startswith('"0",')]
    return text + "\n".join(again) + "\n"


@pytest.mark.parametrize("break_it, needle", [
    (lambda t: t.replace('"thread Domain:Push/Pop_Range', '"thread Domain:Other'), "run ncu with --nvtx"),
    (lambda t: t.replace('"Metric Name"', '"Metric"'), "expected columns"),
    (lambda t: t.replace(":g38:", ":g99:"), "name no profile"),
    (lambda t: t.replace("counters", "sweep"), "outside the NVTX range 'counters'"),
    (lambda t: t.replace('"(2, 66, 1)"', '"(3, 66, 1)"'), "different runs"),
    (lambda t: t.replace("CatArrayBatchedCopy_vectorized<", "CatArrayBatchedCopy<"), "different runs"),
    (lambda t: t.replace('"byte"', '"Pbyte"'), "dram__bytes_read.sum in unit 'Pbyte'"),
    (lambda t: t.replace('"ns"', '"cycle"'), "gpu__time_duration.sum in unit 'cycle'"),
    (lambda t: t.split('"ID",')[0], "no \"ID\" header"),
    (twice, "g38 on whole profiled twice"),
])
def test_bad_csv_is_a_usage_error(break_it, needle):
    text, groups = real()
    with pytest.raises(UsageError) as caught:
        parse_counters(break_it(text), groups)
    assert needle in str(caught.value), str(caught.value)


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


def census(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "census", *map(str, args)])
    try:
        main()
    except SystemExit as stop:
        return stop.code, capsys.readouterr()
    return 0, capsys.readouterr()


@pytest.fixture
def files(tmp_path):
    """The decode step's counters run beside a cost table of the prefill step (another program)."""
    for name in ("llama8b-decode.ncu.csv.gz", "llama8b-decode.groups.json"):
        shutil.copy(COUNTERS / name, tmp_path / name)
    shutil.copy(DATA / "h200-capture" / "llama8b-prefill.profile.json", tmp_path / "prefill.profile.json")
    shutil.copy(DATA / "h200-capture" / "llama8b-decode.profile.json", tmp_path / "decode.profile.json")
    return tmp_path


@pytest.mark.parametrize("args, needle", [
    (("decode.profile.json", "--counters", "none.ncu.csv"), "none.ncu.csv: cannot read"),
    (("decode.profile.json", "--counters", "toy.csv"), "give --groups too"),
    (("decode.profile.json", "--counters", "bad.ncu.csv", "--groups", "llama8b-decode.groups.json"),
     "expected columns"),
    (("prefill.profile.json", "--counters", "llama8b-decode.ncu.csv.gz"), "1975 launches, the cost table has 1782"),
    (("decode.profile.json", "--counters", "llama8b-decode.ncu.csv.gz", "--class-on", "h100"),
     "ncu returned counters for whole, compute, bandwidth only"),
    (("decode.profile.json", "--between", "compute,h100"), "--between: need two of the table's profiles"),
])
def test_census_bad_input_is_one_line(files, monkeypatch, capsys, args, needle):
    text = gzip.decompress((files / "llama8b-decode.ncu.csv.gz").read_bytes()).decode()
    (files / "toy.csv").write_text(text)
    (files / "bad.ncu.csv").write_text(text.replace('"Metric Value"', '"Value"'))
    code, out = census(monkeypatch, capsys, *[files / a if re.search(r"\.(csv|json|gz)$", a) else a for a in args])
    assert code == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and "Traceback" not in out.err, out.err
    assert needle in lines[0], lines[0]
