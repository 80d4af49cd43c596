"""kernelfleet.hook on the CPU: exact FLOP counts per precision, sampled steps, the agent's
MFU from them, and the mismatch event when a job's own MFU disagrees with its OFU."""

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent, attribute_recorded
from kernelfleet.fleet.server import agent_app
from kernelfleet.fleet.store import Store
from kernelfleet.hook import FlopCount, Tracker, post_json, precision_of
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.telemetry.sample import ProcessSample

pytestmark = pytest.mark.unit
DROP = Path(__file__).parents[1] / "data" / "h200-detector" / "h200-drop.jsonl.gz"


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
    agent = Agent(ReplaySource(DROP), Store(tmp_path / "kf.db"), Catalog.load(), identify=lambda p: recorded)
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
    tracker = Tracker(every=2, report_seconds=1e9, send=send, clock=lambda: next(ticks), reported_mfu=lambda: 0.69)
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
