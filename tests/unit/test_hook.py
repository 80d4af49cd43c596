"""kernelfleet.hook on the CPU: exact FLOP counts per precision, sampled steps, the agent's
MFU from them, the tile correction (matmuls paired with the GEMM kernels an H200 ran), and
the mismatch event when a job's own MFU disagrees with its (corrected) OFU."""

import gzip
import http.client
import json
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fastapi.testclient import TestClient
from recorded import at_end_of

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.fleet.agent import Agent, attribute_recorded, tile_corrected_ofu
from kernelfleet.fleet.server import agent_app
from kernelfleet.fleet.store import Store
from kernelfleet.flops import FlopCount, precision_of
from kernelfleet.hook import (
    KernelTrace,
    Launch,
    NoCorrection,
    Tracker,
    cuda_kernels,
    executed_flops,
    launches_of,
    padding_flops,
    post_json,
)
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.telemetry.sample import ProcessSample

pytestmark = pytest.mark.unit
DATA = Path(__file__).parents[1] / "data"
DROP = DATA / "h200-detector" / "h200-drop.jsonl.gz"
SWEEP = DATA / "h200-sweep" / "sweep-points.jsonl.gz"
H200 = Catalog.load().lookup("NVIDIA H200", None)


def test_flops_of_a_linear_layer_forward_and_backward():
    x = torch.randn(64, 128, dtype=torch.bfloat16, requires_grad=True)
    layer = torch.nn.Linear(128, 256).to(torch.bfloat16)
    with FlopCount() as count:
        layer(x).float().sum().backward()
    # forward 2·64·128·256, and the two backward GEMMs (input and weight gradients) as much each
    assert dict(count.flops) == {"bf16": 3 * 2 * 64 * 128 * 256}
    assert count.shapes["addmm", ((256,), (64, 128), (128, 256)), "torch.bfloat16"] == 1


def test_precision_follows_dtype_and_the_tf32_setting():
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    previous = torch.get_float32_matmul_precision()
    try:
        for setting, expected in (("highest", "fp32"), ("high", "tf32")):
            torch.set_float32_matmul_precision(setting)
            with FlopCount() as count:
                a @ b
            assert dict(count.flops) == {expected: 2 * 32 * 64 * 16}
    finally:
        torch.set_float32_matmul_precision(previous)
    assert precision_of(torch.float16) == "fp16" and precision_of(torch.float64) == "fp64_tensor"


def test_attention_flops_come_from_torchs_formulas():
    q = k = v = torch.randn(2, 4, 128, 64, dtype=torch.bfloat16)
    with FlopCount() as count:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    # QKᵀ and AV: 2 x 2·b·h·s²·d (the CPU's fused kernel counted as flash attention)
    assert dict(count.flops) == {"bf16": 2 * 2 * 2 * 4 * 128 * 128 * 64}


@pytest.fixture
def agent_on_a_recording(tmp_path):
    """The clean half of an H200 recording (OFU ~0.69); every PID is the recorded job."""
    recorded = attribute_recorded(ProcessSample(pid=414, name="python3"))
    agent = Agent(ReplaySource(DROP), Store(tmp_path / "kf.db"), Catalog.load(), identify=lambda p: recorded,
                  clock=at_end_of(DROP))
    for i, batch in enumerate(ReplaySource(DROP).batches()):
        agent.step(batch)
        if i == 30:
            break
    return agent


def test_tracker_reports_sampled_steps_and_the_agent_computes_mfu(agent_on_a_recording):
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    answers = []
    send = lambda url, body, token: answers.append(client.post("/api/hook", json=body).json())  # noqa: E731
    ticks = iter(float(t) for t in range(100))
    tracker = Tracker(every=2, report_seconds=1e9, send=send, clock=lambda: next(ticks), reported_mfu=lambda: 0.69,
                      profile_every=None)
    a, b = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(128, 32, dtype=torch.bfloat16)
    for _ in range(4):
        with tracker.step():
            a @ b
    tracker.flush()
    (answer,) = answers
    # two of four steps counted, one fake second each: 2 x 2·64·128·32 FLOPs over 2 s on one H200
    assert answer["job"] == "python3-414" and answer["gpus"] == 1.0
    assert answer["hook_mfu_ratio"] == pytest.approx(2 * 2 * 64 * 128 * 32 / 989.4e12 / 2.0)
    assert answer["ofu_ratio"] == pytest.approx(0.69, abs=0.02)
    assert answer["gemms"][0]["shapes"] == [[64, 128], [128, 32]] and answer["gemms"][0]["count"] == 2
    assert agent_on_a_recording.store.events() == []  # 0.69 reported, 0.69 measured: consistent


def test_a_job_reporting_twice_its_ofu_gets_a_mismatch_event(agent_on_a_recording):
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    body = {"pid": 1234, "steps": 1, "seconds": 1.0, "useful_flops": {"bf16": 1e12}, "reported_mfu": 1.4}
    assert client.post("/api/hook", json=body).status_code == 200
    (event,) = agent_on_a_recording.store.events()
    assert event["kind"] == "mfu-mismatch" and "reports MFU 1.400" in event["detail"]
    assert client.get("/api/jobs/python3-414").json()["hook"]["reported_mfu_ratio"] == 1.4


@pytest.mark.parametrize("body", [{"pid": 0, "steps": 1, "seconds": 1, "useful_flops": {}},
                                  {"pid": 5, "steps": 1, "seconds": -1, "useful_flops": {}},
                                  {"pid": 5, "steps": 1, "seconds": 1}])
def test_a_malformed_report_is_a_422(agent_on_a_recording, body):
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    assert client.post("/api/hook", json=body).status_code == 422


def test_an_unreachable_agent_never_breaks_the_job():
    tracker = Tracker(agent_url="http://127.0.0.1:9", every=1, report_seconds=0.0, send=post_json)
    with tracker.step():
        torch.randn(8, 8) @ torch.randn(8, 8)  # flush runs at the end of the step and fails quietly
    assert tracker.steps == 1


def test_an_agent_that_drops_the_connection_never_breaks_the_job():
    def dropped(url, body, token):
        raise http.client.IncompleteRead(b"")  # an HTTPException, not an OSError

    tracker = Tracker(every=1, report_seconds=0.0, send=dropped, profile_every=None)
    with tracker.step():
        torch.randn(8, 8) @ torch.randn(8, 8)
    assert tracker.steps == 1


@pytest.mark.parametrize("given, sent", [(torch.tensor(0.42), 0.42), (0.5, 0.5), (float("nan"), None),
                                         ("n/a", None), (None, None)])
def test_the_jobs_own_mfu_goes_out_as_a_plain_float(given, sent):
    """A trainer's MFU is often a tensor or NumPy scalar, which json.dumps refuses."""
    bodies = []
    tracker = Tracker(every=1, report_seconds=1e9, reported_mfu=lambda: given, profile_every=None,
                      send=lambda url, body, token: bodies.append(json.loads(json.dumps(body))))
    with tracker.step():
        torch.randn(8, 8) @ torch.randn(8, 8)
    tracker.flush()
    if sent is None:
        assert bodies[0]["reported_mfu"] is None
    else:
        assert bodies[0]["reported_mfu"] == pytest.approx(sent)


# --- the tile correction ------------------------------------------------------------------------


def op_event(op, start, *kernels):
    """What torch.profiler's ``events()`` holds for one CPU op and the kernels it launched."""
    return SimpleNamespace(name=op, device_type=torch.autograd.DeviceType.CPU, time_range=SimpleNamespace(start=start),
                           kernels=[SimpleNamespace(name=k) for k in kernels])


def kernel_event(name, start):
    return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA, time_range=SimpleNamespace(start=start),
                           kernels=[])


def sweep_points():
    with gzip.open(SWEEP, "rt") as f:
        return [p for p in map(json.loads, f) if "error" not in p]


@pytest.mark.replay
def test_every_h200_sweep_gemm_pairs_with_the_kernel_that_ran_it():
    """All 60 sweep GEMMs as one step: each point's recorded kernels (memsets included) hang on
    its op, with elementwise work, a split-K reduction and an attention kernel in between."""
    points = sweep_points()
    calls, events = [], []
    for i, p in enumerate(points):
        op = "_scaled_mm" if p["precision"] == "fp8" else "mm"
        calls.append((op, ((p["m"], p["k"]), (p["k"], p["n"])), p["precision"]))
        kernels = p["kernels"] + (["void cublasLt::splitKreduce_kernel<32, 16, int, float>()"] if i == 7 else [])
        events += [op_event(f"aten::{op}", 10.0 * i, *kernels),
                   op_event("aten::add_", 10.0 * i + 5, "void at::native::vectorized_elementwise_kernel<4>()"),
                   kernel_event(p["kernels"][-1], 10.0 * i + 1)]
    events.append(op_event("aten::_efficient_attention_forward", 3.0, "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"))
    launches = launches_of(reversed(events))  # the profiler's list is in no particular order
    assert [launch.op for launch in launches[:3]] == ["aten::mm", "aten::_efficient_attention_forward", "aten::add_"]

    padding = padding_flops(calls, launches)

    expected = {}
    for (op, ((m, k), (_, n)), precision), p in zip(calls, points):
        kernel = p["kernels"][-1]  # the sweep lists its names sorted: the GEMM after "Memset (Device)"
        expected[precision] = expected.get(precision, 0) + executed_flops_of_kernel(m, n, k, kernel) - 2 * m * n * k
    assert padding == expected
    assert set(padding) == {"bf16", "fp16", "tf32", "fp8", "fp64"} and all(v >= 0 for v in padding.values())
    assert padding["bf16"] > 0  # 200³, 1000³, 3000³ and 8200³ are no tile multiples


def test_executed_flops_of_one_step_by_hand():
    """Three matmuls of a step, one per kernel family, worked out from the names' tiles."""
    calls = [
        ("mm", ((512, 512), (512, 512)), "bf16"),
        ("addmm", ((1000,), (1000, 1000), (1000, 1000)), "fp16"),
        ("bmm", ((4, 200, 200), (4, 200, 200)), "tf32"),
    ]
    trace = KernelTrace(launches_of([
        op_event("aten::mm", 1.0, "nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT"),
        op_event("aten::addmm", 2.0, "Memset (Device)", "nvjet_sm90_hsh_128x72_64x8_4x2_h_bz_NNT"),
        op_event("aten::bmm", 3.0, "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>"
                                   "(cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4::Params)"),
    ]))
    useful = {"bf16": 2 * 512**3 + 7_000, "fp16": 2 * 1000**3, "tf32": 2 * 4 * 200**3}  # 7,000: attention
    # 64×48 tiles in 2×4 clusters: torch N 512 → 512 (128s), torch M 512 → 576 (192s), K 512 → 512
    # 128×72 tiles in 4×2 clusters: torch N 1000 → 1024 (512s), M 1000 → 1008 (144s), K → 1024 (64s)
    # 64×64×32 tiles, no cluster, 4 batches: N and M 200 → 256, K 200 → 224
    assert executed_flops(useful, calls, trace) == {
        "bf16": 2 * 512 * 576 * 512 + 7_000,
        "fp16": 2 * 1024 * 1008 * 1024,
        "tf32": 2 * 4 * 256 * 256 * 224,
    }


@pytest.mark.parametrize("launches, reason", [
    ([Launch("aten::mm", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")], "dispatched 2 matmuls but the profiler saw 1"),
    ([Launch("aten::mm", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT"),
      Launch("aten::mm", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")], "matmul 1 was bmm but .* came from aten::mm"),
    ([Launch("aten::mm", "ampere_sgemm_128x64_nn"), Launch("aten::bmm", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")],
     "kernel ampere_sgemm_128x64_nn states no tile"),
    ([Launch("aten::mm", "gemv2T_kernel_val<int, int, 128, 16, 4, 4, false>"),
      Launch("aten::bmm", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")], "gemv2T_kernel_val.* states no tile"),
    ([Launch(None, "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT"), Launch("aten::bmm", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")],
     "saw 1 GEMM kernels"),
])
def test_no_correction_when_the_kernels_do_not_pair_exactly(launches, reason):
    calls = [("mm", ((200, 200), (200, 200)), "bf16"), ("bmm", ((2, 200, 200), (2, 200, 200)), "bf16")]
    with pytest.raises(NoCorrection, match=reason):
        padding_flops(calls, launches)


def test_an_empty_matmul_launches_no_kernel_and_is_skipped():
    calls = [("mm", ((0, 64), (64, 64)), "bf16"), ("mm", ((200, 200), (200, 200)), "bf16")]
    assert padding_flops(calls, [Launch("aten::mm", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")]) == {
        "bf16": 2 * 256 * 224 * 256 - 2 * 200**3}


def test_the_profiler_on_a_cpu_sees_no_kernels_and_leaves_a_running_profiler_alone():
    with cuda_kernels() as trace:
        torch.randn(8, 8) @ torch.randn(8, 8)
    assert trace.problem is None and trace.launches == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as outer:
        with cuda_kernels() as trace:
            torch.randn(8, 8) @ torch.randn(8, 8)
    assert "another profiler" in trace.problem
    assert any(e.name == "aten::mm" for e in outer.events())  # its session survived


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: with CUDA the default profiler runs")
def test_on_a_cpu_the_tracker_reports_no_executed_flops_and_the_agent_no_correction(agent_on_a_recording):
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    bodies, answers = [], []
    send = lambda url, body, token: (bodies.append(body), answers.append(client.post("/api/hook", json=body).json()))  # noqa: E731
    tracker = Tracker(every=1, report_seconds=1e9, send=send)  # the default profiler, on this CPU machine
    for _ in range(3):
        with tracker.step():
            torch.randn(64, 128, dtype=torch.bfloat16) @ torch.randn(128, 32, dtype=torch.bfloat16)
    tracker.flush()
    (body,), (answer,) = bodies, answers
    assert body["steps"] == 3 and body["useful_flops"] == {"bf16": 3 * 2 * 64 * 128 * 32}  # none was profiled
    assert body["executed_flops"] is None and body["profiled_useful_flops"] is None
    assert body["correction_note"] == "no CUDA device: no kernels to profile"
    assert answer["hook_mfu_ratio"] is not None and answer["corrected_ofu_ratio"] is None
    assert answer["correction_note"] == "no CUDA device: no kernels to profile"


def test_a_profiled_step_gives_the_agent_a_tile_corrected_ofu(agent_on_a_recording):
    """Real torch on the CPU and a stand-in profiler that reports the kernel an H200 ran for 200³ bf16."""
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    bodies, answers = [], []
    send = lambda url, body, token: (bodies.append(body), answers.append(client.post("/api/hook", json=body).json()))  # noqa: E731

    @contextmanager
    def h200_profile():
        trace = KernelTrace()
        yield trace
        trace.launches = launches_of([op_event("aten::mm", 1.0, "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT")])

    ticks = iter(float(t) for t in range(100))
    tracker = Tracker(every=1, report_seconds=1e9, send=send, clock=lambda: next(ticks), profile_every=3,
                      profile=h200_profile)
    a, b = torch.randn(200, 200, dtype=torch.bfloat16), torch.randn(200, 200, dtype=torch.bfloat16)
    for _ in range(3):
        with tracker.step():
            a @ b
    tracker.flush()
    (body,), (answer,) = bodies, answers
    # the first step was profiled, not timed; 64×8 tiles in 2×4 clusters pad 200³ to 256×224×256
    executed = 2 * 256 * 224 * 256
    assert body["steps"] == 2 and body["useful_flops"] == {"bf16": 2 * 2 * 200**3}
    assert body["profiled_useful_flops"] == {"bf16": 2 * 200**3} and body["executed_flops"] == {"bf16": executed}
    assert body["correction_note"] is None
    assert answer["corrected_ofu_ratio"] == pytest.approx(answer["ofu_ratio"] * 2 * 200**3 / executed)
    assert answer["correction_note"] is None
    assert client.get("/api/jobs/python3-414").json()["hook"]["corrected_ofu_ratio"] == answer["corrected_ofu_ratio"]


def test_a_profiled_step_that_does_not_pair_says_why_in_the_report():
    bodies = []
    tracker = Tracker(every=1, report_seconds=1e9, send=lambda url, body, token: bodies.append(body), profile_every=2,
                      profile=lambda: contextmanager(lambda: (yield KernelTrace()))())
    for _ in range(2):
        with tracker.step():
            torch.randn(8, 8) @ torch.randn(8, 8)
    tracker.flush()
    (body,) = bodies
    assert body["executed_flops"] is None and body["steps"] == 1
    assert body["correction_note"].startswith("the step dispatched 1 matmuls but the profiler saw 0 GEMM kernels")


def test_profiling_every_counted_step_would_leave_none_timed():
    with pytest.raises(UsageError, match="profile_every must be at least 2"):
        Tracker(profile_every=1)


def test_the_agent_corrects_ofu_by_useful_over_executed(agent_on_a_recording):
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    body = {"pid": 1234, "steps": 1, "seconds": 1.0, "useful_flops": {"bf16": 1e12},
            "profiled_useful_flops": {"bf16": 8e11}, "executed_flops": {"bf16": 1e12}}
    answer = client.post("/api/hook", json=body).json()
    assert answer["ofu_ratio"] == pytest.approx(0.69, abs=0.02)
    assert answer["corrected_ofu_ratio"] == pytest.approx(answer["ofu_ratio"] * 0.8)
    assert answer["correction_note"] is None


def test_a_report_without_executed_flops_gets_no_corrected_ofu(agent_on_a_recording):
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    body = {"pid": 1234, "steps": 1, "seconds": 1.0, "useful_flops": {"bf16": 1e12}}
    answer = client.post("/api/hook", json=body).json()
    assert answer["ofu_ratio"] is not None and answer["corrected_ofu_ratio"] is None
    assert answer["correction_note"] == "the report has no executed FLOPs (no profiled step)"


def test_precisions_are_weighted_by_their_tensor_pipe_time():
    useful, executed = {"bf16": 4e12, "fp8": 4e12}, {"bf16": 5e12, "fp8": 8e12}
    corrected, note = tile_corrected_ofu(0.5, useful, executed, H200)
    # H200 dense peaks: bf16 989.4, fp8 1978.9 TFLOP/s; an fp8 FLOP is half the pipe time
    assert note is None
    assert corrected == pytest.approx(0.5 * (4 / 989.4 + 4 / 1978.9) / (5 / 989.4 + 8 / 1978.9))
    assert tile_corrected_ofu(0.5, {"int32": 1.0}, {"int32": 2.0}, H200) == (None, "h200-sxm has no dense peak for int32")
    assert tile_corrected_ofu(0.5, {"bf16": 2.0}, {"bf16": 1.0}, H200)[0] is None


def test_the_mismatch_check_uses_the_corrected_ofu(agent_on_a_recording):
    """Raw OFU ~0.68 on the recording; half the executed work is tile padding, so ~0.34 is right."""
    client = TestClient(agent_app(agent_on_a_recording, agent_on_a_recording.store))
    padded = {"pid": 1234, "steps": 1, "seconds": 1.0, "useful_flops": {"bf16": 1e12},
              "profiled_useful_flops": {"bf16": 5e11}, "executed_flops": {"bf16": 1e12}}
    answer = client.post("/api/hook", json={**padded, "reported_mfu": 0.35}).json()
    assert abs(0.35 - answer["ofu_ratio"]) > 0.10  # raw OFU would have flagged an honest job
    assert agent_on_a_recording.store.events() == []
    client.post("/api/hook", json={**padded, "reported_mfu": answer["ofu_ratio"]})
    (event,) = agent_on_a_recording.store.events()
    assert event["kind"] == "mfu-mismatch" and "tile-corrected OFU is 0.338" in event["detail"]
