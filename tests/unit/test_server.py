"""The agent's HTTP API through FastAPI's test client: data, 4xx on bad input, token."""

import threading

import pytest
from fastapi.testclient import TestClient

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.server import agent_app
from kernelfleet.fleet.store import Store
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
UUID = "GPU-ba2fb2e1-e13f-855e-a2da-7a7eab16b60f"


@pytest.fixture
def served(tmp_path, h200_trace):
    store = Store(tmp_path / "kf.db")
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, Catalog.load(), host="node-1")
    agent.run(threading.Event())
    return agent, store


def test_metrics_and_gpus(served):
    client = TestClient(agent_app(*served))
    text = client.get("/metrics").text
    assert f'kernelfleet_sample_stale{{gpu="0",hostname="node-1",mig="",model="h200-sxm",uuid="{UUID}"}} 0.0' in text
    assert 'kernelfleet_reference_clock_hertz{source="catalog:h200-sxm:measured"' in text
    (gpu,) = client.get("/api/gpus").json()
    assert gpu["uuid"] == UUID and gpu["bottleneck"] == "idle"  # the recording ends idle


def test_fleet_series_serves_the_per_minute_fleet_rollup(served):
    client = TestClient(agent_app(*served))
    points = client.get("/api/fleet/series", params={"start": 0, "end": 2e9}).json()["points"]
    assert points and all(p["gpus"] == 1 for p in points)
    assert client.get("/api/fleet/series", params={"start": 5, "end": 1}).status_code == 422


def test_series(served):
    client = TestClient(agent_app(*served))
    body = client.get("/api/series", params={"uuid": UUID, "start": 0, "end": 2e9, "metric": ["ofu", "power_watts"]}).json()
    assert len(body["points"]) == 24 and set(body["points"][0]) == {"ts", "ofu", "power_watts"}


@pytest.mark.parametrize(
    "params, status, text",
    [
        ({"uuid": "GPU-nope", "start": 0, "end": 1}, 404, "no GPU"),
        ({"uuid": UUID, "start": 5, "end": 1}, 422, "start must not be after end"),
        ({"uuid": UUID, "resolution": "5m"}, 422, "resolution"),
        ({"uuid": UUID, "metric": "bogus", "start": 0, "end": 1}, 422, "unknown metric"),
        ({"uuid": UUID, "start": "yesterday"}, 422, "start"),
        ({}, 422, "uuid"),
    ],
)
def test_bad_parameters_get_a_4xx_with_a_message(served, params, status, text):
    response = TestClient(agent_app(*served)).get("/api/series", params=params)
    assert response.status_code == status and text in response.text


def test_bearer_token(served):
    client = TestClient(agent_app(*served, token="s3cret"))
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
