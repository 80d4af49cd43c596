"""Stale never looks live: a GPU that stops reporting is stale after two missed windows (no OFU in
the API, its stale marker in /metrics, out of the fleet's OFU), leaves everything after the agent's
expiry, and /healthz fails while the sampler itself takes no window."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.server import agent_app
from kernelfleet.telemetry.sample import Sample

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def window(t: float, *gpus: int) -> list[Sample]:
    return [Sample(timestamp_seconds=t, window_seconds=1.0, gpu_index=g, uuid=f"GPU-{g}", name="NVIDIA H200",
                   tensor_active_ratio=0.5, sm_active_ratio=0.9, sm_clock_mean_hertz=1.5e9, sm_clock_max_hertz=1.98e9,
                   dram_bandwidth_ratio=0.2) for g in gpus]


@pytest.fixture
def agent() -> tuple[Agent, Clock]:
    clock = Clock()
    return Agent(None, None, Catalog.load(), host="node-1", clock=clock, expire_seconds=30.0), clock  # type: ignore[arg-type]


def step(agent: Agent, clock: Clock, t: float, *gpus: int) -> None:
    clock.now = t
    agent.step(window(t, *gpus))


def stale_of(agent: Agent) -> dict[str, bool]:
    return {r.sample.uuid: r.sample.stale for r in agent.latest()}


def test_a_gpu_is_stale_after_two_missed_windows_and_shows_no_ofu(agent):
    agent, clock = agent
    for t in (1.0, 2.0, 3.0):
        step(agent, clock, 1000 + t, 0, 1)
    step(agent, clock, 1004.0, 0)
    assert stale_of(agent) == {"GPU-0": False, "GPU-1": False}  # one missed window is a late one
    step(agent, clock, 1005.0, 0)
    assert stale_of(agent) == {"GPU-0": False, "GPU-1": True}
    client = TestClient(agent_app(agent, None))
    gone = next(g for g in client.get("/api/gpus").json()["gpus"] if g["uuid"] == "GPU-1")
    assert gone["ofu_ratio"] is None and gone["stale_reason"] == "missing from the last 2 windows"
    assert gone["timestamp_seconds"] == 1003.0  # the page says how long ago it was last seen
    metrics = client.get("/metrics").text
    assert 'kernelfleet_sample_stale{container="",gpu="1",hostname="node-1",mig="",model="h200-sxm",namespace="",pod="",uuid="GPU-1"} 1.0' in metrics
    assert 'kernelfleet_ofu_ratio{container="",gpu="1"' not in metrics and 'kernelfleet_ofu_ratio{container="",gpu="0"' in metrics
    fleet = client.get("/api/fleet").json()
    assert (fleet["gpus"], fleet["gpus_with_ofu"]) == (2, 1)  # a frozen GPU no longer halves the mean
    step(agent, clock, 1006.0, 0, 1)
    assert stale_of(agent) == {"GPU-0": False, "GPU-1": False}  # back as soon as it reports


def test_a_gpu_silent_past_the_expiry_leaves_metrics_and_the_fleet(agent):
    agent, clock = agent
    step(agent, clock, 1001.0, 0, 1)
    for t in range(2, 32):
        step(agent, clock, 1000.0 + t, 0)
    assert set(stale_of(agent)) == {"GPU-0", "GPU-1"}  # 30 s of silence: not yet past the expiry
    step(agent, clock, 1032.0, 0)
    assert set(stale_of(agent)) == {"GPU-0"}
    client = TestClient(agent_app(agent, None))
    assert 'uuid="GPU-1"' not in client.get("/metrics").text
    assert client.get("/api/fleet").json()["gpus"] == 1


def test_healthz_fails_while_the_sampler_takes_no_window(agent):
    agent, clock = agent
    client = TestClient(agent_app(agent, None))
    assert client.get("/healthz").status_code == 200  # starting: the first window is not yet due
    step(agent, clock, 1001.0, 0)
    clock.now = 1010.0
    assert client.get("/healthz").status_code == 200
    clock.now = 1011.5  # more than the 10-s floor since the last window
    response = client.get("/healthz")
    assert response.status_code == 503 and response.json()["sampler"] == "stale: no window lately"
    assert stale_of(agent) == {"GPU-0": True}
    assert next(iter(agent.latest())).sample.error == "the sampler has taken no window"
    step(agent, clock, 1012.0, 0)
    assert client.get("/healthz").status_code == 200 and stale_of(agent) == {"GPU-0": False}
