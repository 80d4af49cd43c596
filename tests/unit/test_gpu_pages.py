"""/api/gpus in pages on the agent's own backend, through the real app: every row exactly once in
one stable order however the pages are cut, a total and a cursor, a GPU that arrives between two
pages moving no other row, and a bad parameter a 400 of one line. (The Prometheus backend pages
over a real server in tests/e2e/test_prometheus_pages.py.)"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.gpu_pages import DEFAULT_LIMIT, MAX_LIMIT, GpuPage, cursor, key
from kernelfleet.fleet.server import agent_app
from kernelfleet.telemetry.sample import Sample

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0


def samples(gpus: range, mig: bool = False) -> list[Sample]:
    return [Sample(timestamp_seconds=NOW, window_seconds=1.0, gpu_index=g % 8, uuid=f"GPU-{g:03d}", name="NVIDIA H200",
                   tensor_active_ratio=0.5, sm_active_ratio=0.9, sm_clock_mean_hertz=1.5e9, sm_clock_max_hertz=1.98e9,
                   dram_bandwidth_ratio=0.2, mig_instance=1 if mig else None) for g in gpus]


@pytest.fixture
def fleet() -> tuple[Agent, TestClient]:
    # the agent of a node that reports GPUs of several hosts (as a dcgm-exporter scrape of a cluster does)
    agent = Agent(None, None, Catalog.load(), host="here", clock=lambda: NOW,  # type: ignore[arg-type]
                  hosts=lambda: {(f"GPU-{g:03d}", mig): f"node-{(g * 7) % 5}" for g in range(41) for mig in (None, 1)})
    agent.step(samples(range(40)) + samples(range(3), mig=True))
    return agent, TestClient(agent_app(agent, None))


def walk(client: TestClient, limit: int) -> list[dict]:
    pages, after = [], None
    while True:
        params = {"limit": limit, **({"after": after} if after else {})}
        body = client.get("/api/gpus", params=params).json()
        assert len(body["gpus"]) <= limit and body["total"] == 43 and body["limit"] == limit
        pages.append(body["gpus"])
        after = body["next_after"]
        if after is None:
            return pages


def test_every_row_once_in_host_gpu_mig_order_however_the_pages_are_cut(fleet):
    _, client = fleet
    whole = client.get("/api/gpus").json()
    assert whole["next_after"] is None and len(whole["gpus"]) == 43 <= DEFAULT_LIMIT
    ordered = [(g["host"], g["gpu"], -1 if g["mig_instance"] is None else g["mig_instance"], g["uuid"])
               for g in whole["gpus"]]
    assert ordered == sorted(ordered) and len(set(ordered)) == 43
    assert {g["host"] for g in whole["gpus"]} == {f"node-{h}" for h in range(5)}
    for limit in (1, 7, 42, 43):
        pages = walk(client, limit)
        assert [g["uuid"] for page in pages for g in page] == [g["uuid"] for g in whole["gpus"]]
        assert len(pages) == -(-43 // limit)  # no empty page at the end


def test_a_gpu_that_arrives_between_two_pages_moves_no_other_row(fleet):
    agent, client = fleet
    first = client.get("/api/gpus", params={"limit": 10}).json()
    rest_before = client.get("/api/gpus", params={"after": first["next_after"]}).json()
    agent.step(samples(range(40, 41)))  # GPU-040 on node-0: before the cursor or after it
    rest_after = client.get("/api/gpus", params={"after": first["next_after"]}).json()
    assert rest_after["total"] == 44
    assert [g["uuid"] for g in rest_after["gpus"] if g["uuid"] != "GPU-040"] == [g["uuid"] for g in rest_before["gpus"]]


@pytest.mark.parametrize("params, says", [
    ({"limit": "0"}, "limit: expected a whole number of rows from 1 to 1000, got '0'"),
    ({"limit": str(MAX_LIMIT + 1)}, "limit: expected a whole number of rows from 1 to 1000, got '1001'"),
    ({"limit": "ten"}, "limit: expected a whole number of rows from 1 to 1000, got 'ten'"),
    ({"after": "not-a-cursor"}, "after: expected the next_after of a page of /api/gpus, got 'not-a-cursor'"),
    ({"after": cursor(("node-1", 0, -1, "GPU-000"))[:-3]}, "after: expected the next_after of a page of /api/gpus"),
])
def test_a_bad_parameter_is_a_400_of_one_line(fleet, params, says):
    _, client = fleet
    response = client.get("/api/gpus", params=params)
    assert response.status_code == 400 and response.json()["detail"].startswith(says)
    assert "\n" not in response.json()["detail"]


def test_a_cursor_is_the_key_of_the_last_row_of_its_page(fleet):
    _, client = fleet
    body = client.get("/api/gpus", params={"limit": 5}).json()
    assert body["next_after"] == cursor(key(body["gpus"][-1]))


def test_the_page_is_sent_as_json_and_named_in_the_api_schema(fleet):
    """The route sends the page's own JSON (not FastAPI's second pass over it): the same document,
    its content type, and the GpuPage schema still in the OpenAPI description."""
    agent, client = fleet
    answer = client.get("/api/gpus?limit=3")
    assert answer.headers["content-type"] == "application/json"
    assert GpuPage.model_validate_json(answer.content).limit == 3
    docs = TestClient(agent_app(agent, None, api_docs=True)).get("/openapi.json").json()
    schema = docs["paths"]["/api/gpus"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/GpuPage"}
    # a value that is not JSON is null, as in every other answer (FiniteJSONResponse)
    odd = GpuPage(gpus=[{"ofu_ratio": float("nan"), "power_watts": float("inf")}], total=1, limit=1, next_after=None)
    assert odd.model_dump_json() == '{"gpus":[{"ofu_ratio":null,"power_watts":null}],"total":1,"limit":1,"next_after":null}'
