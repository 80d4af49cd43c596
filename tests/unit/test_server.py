"""The agent's HTTP API through FastAPI's test client: data, 4xx on bad input, token."""

import threading

import pytest
from fastapi.testclient import TestClient
from recorded import at_end_of

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
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, Catalog.load(), host="node-1",
                  clock=at_end_of(h200_trace / "h200-bf16-gemm.jsonl.gz"))
    agent.run(threading.Event())
    return agent, store


def test_metrics_and_gpus(served):
    client = TestClient(agent_app(*served))
    text = client.get("/metrics").text
    assert f'kernelfleet_sample_stale{{container="",gpu="0",hostname="node-1",mig="",model="h200-sxm",namespace="",pod="",uuid="{UUID}"}} 0.0' in text
    assert 'kernelfleet_reference_clock_hertz{source="catalog:h200-sxm:measured"' in text
    (gpu,) = client.get("/api/gpus").json()["gpus"]
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
    assert client.get("/metrics", headers={"Authorization": "bearer s3cret"}).status_code == 200  # scheme in any case
    assert client.get("/metrics", headers={"Authorization": "Basic s3cret"}).status_code == 401


def test_api_docs_are_off_unless_asked_for(served):
    closed = TestClient(agent_app(*served, token="s3cret"))
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert closed.get(path).status_code == 404
    assert TestClient(agent_app(*served, api_docs=True)).get("/openapi.json").status_code == 200


def test_an_oversized_hook_body_is_refused_before_it_is_read(served):
    client = TestClient(agent_app(*served))
    huge = b'{"pid": 1, "steps": 1, "seconds": 1, "useful_flops": {}, "gemms": [' + b"{}," * 3_000_000 + b"{}]}"
    assert client.post("/api/hook", content=huge, headers={"content-type": "application/json"}).status_code == 413

    def chunks():  # no Content-Length: the cap counts what streams in
        yield b'{"pid": 1, "steps": 1, "seconds": 1, "useful_flops": {}, "gemms": ['
        for _ in range(100):
            yield b"{}," * 10_000
        yield b"{}]}"

    response = client.post("/api/hook", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "request body over" in response.json()["detail"]


def test_nan_and_infinity_in_a_hook_report_are_a_422_not_a_500(served):
    client = TestClient(agent_app(*served))
    for bad in ("NaN", "Infinity", "-Infinity"):
        body = f'{{"pid": 1, "steps": 1, "seconds": {bad}, "useful_flops": {{"bf16": 1e12}}}}'
        assert client.post("/api/hook", content=body, headers={"content-type": "application/json"}).status_code == 422


def test_the_hook_table_keeps_the_newest_jobs_only(served, monkeypatch):
    import kernelfleet.fleet.agent as agent_module
    from kernelfleet.fleet.attribution import JobIdentity

    monkeypatch.setattr(agent_module, "MAX_HOOK_JOBS", 3)
    agent, _ = served
    agent.identify = lambda p: JobIdentity(p.pid, f"job-{p.pid}", "label", *[None] * 7)
    client = TestClient(agent_app(*served))
    for pid in range(10, 16):
        assert client.post("/api/hook", json={"pid": pid, "steps": 1, "seconds": 1.0,
                                              "useful_flops": {"bf16": 1e12}}).status_code == 200
    assert list(agent.hooks) == ["job-13", "job-14", "job-15"]


def test_a_metric_asked_for_many_times_is_one_column(served):
    response = TestClient(agent_app(*served)).get("/api/series", params={"uuid": UUID, "start": 0, "end": 2e9,
                                                                         "metric": ["ofu"] * 2000})
    assert response.status_code == 200 and response.json()["metrics"] == ["ofu"]


def test_non_finite_numbers_leave_the_api_as_null_and_metrics_without_them():
    from kernelfleet.fleet.exporter import OfuCollector
    from kernelfleet.fleet.reading import Reading
    from kernelfleet.fleet.server import FiniteJSONResponse
    from kernelfleet.ofu import ofu
    from kernelfleet.telemetry.sample import Sample

    body = FiniteJSONResponse({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}}).body
    assert body == b'{"a":null,"b":[1.0,null],"c":{"d":null}}'
    sample = Sample(timestamp_seconds=1.0, window_seconds=1.0, gpu_index=0, uuid="GPU-x", name="NVIDIA H200",
                    tensor_active_ratio=float("nan"), power_mean_watts=float("inf"), sm_active_ratio=0.5)
    families = {f.name: f for f in OfuCollector(lambda: [Reading("node", sample, None, ofu(sample, None), "idle")]).collect()}
    assert [s.value for s in families["kernelfleet_sm_active_ratio"].samples] == [0.5]
    assert families["kernelfleet_tensor_active_ratio"].samples == [] and families["kernelfleet_power_watts"].samples == []


def test_a_series_comes_in_pages_that_add_up_to_the_whole(served):
    client = TestClient(agent_app(*served))
    whole = client.get("/api/series", params={"uuid": UUID, "start": 0, "end": 2e9}).json()
    assert len(whole["points"]) == 24 and whole["next_start"] is None
    pages, start = [], 0.0
    while start is not None:
        page = client.get("/api/series", params={"uuid": UUID, "start": start, "end": 2e9, "limit": 10}).json()
        assert len(page["points"]) <= 10
        pages += page["points"]
        start = page["next_start"]
    assert pages == whole["points"]
    assert client.get("/api/series", params={"uuid": UUID, "limit": 10**6}).status_code == 422  # bounded


def test_lists_are_bounded_and_events_are_the_newest(served):
    agent, store = served
    for k in range(5):
        store.add_event(1000.0 + k, "test", f"event {k}")
    client = TestClient(agent_app(*served))
    newest = client.get("/api/events", params={"limit": 2}).json()
    assert [e["detail"] for e in newest] == ["event 3", "event 4"]  # the newest two, oldest first
    assert client.get("/api/events", params={"limit": 0}).status_code == 422
    assert client.get("/api/jobs", params={"limit": 10**6}).status_code == 422
    assert client.get("/api/jobs/summary", params={"limit": 1}).status_code == 200
