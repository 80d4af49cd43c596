"""The Prometheus backend on a real server over a day that ended three hours ago (backfilled with
promtool, as bench/fleet_scale.py makes its fleets): its instant queries run at its clock, not at
Prometheus's now (where the 5-minute lookback finds nothing), and /api/gpus walks the fleet in
pages that each read a few hosts' series, never every GPU's."""

from __future__ import annotations

import re
import time
import urllib.parse

import pytest
from fastapi.testclient import TestClient

from bench.fleet_scale import served_tsdb
from kernelfleet.fleet.prometheus_backend import PrometheusBackend, http_json
from kernelfleet.fleet.server import create_app

pytestmark = pytest.mark.e2e
GPUS = 44  # 5 hosts of 8 and one of 4


@pytest.fixture(scope="module")
def past_day(tmp_path_factory):
    end = (time.time() - 3 * 3600) // 60 * 60
    with served_tsdb(tmp_path_factory.mktemp("tsdb"), GPUS, end, 60, 7200, 2) as (url, _):
        yield url, end


def test_instant_queries_read_the_backends_clock(past_day):
    url, end = past_day
    assert PrometheusBackend(url).gpus() == []  # at Prometheus's now the day is past its lookback
    backend = PrometheusBackend(url, clock=lambda: end)
    assert len(backend.gpus()) == GPUS and backend.fleet()["gpus"] == GPUS


def watched(past_day) -> tuple[PrometheusBackend, list[str]]:
    """A backend on the served day, and the queries it sends (unquoted), as it sends them."""
    url, end = past_day
    asked: list[str] = []

    def fetch(address: str):
        asked.append(urllib.parse.unquote(address))
        return http_json(address)

    return PrometheusBackend(url, fetch=fetch, clock=lambda: end), asked


def test_pages_of_a_few_hosts_give_every_gpu_once_in_order(past_day):
    backend, asked = watched(past_day)
    whole = backend.gpus()
    client = TestClient(create_app(backend))
    rows, after = [], None
    while True:
        asked.clear()
        body = client.get("/api/gpus", params={"limit": 12, **({"after": after} if after else {})}).json()
        assert body["total"] == GPUS and 0 < len(body["gpus"]) <= 12
        rows += body["gpus"]
        stale = [a for a in asked if "query=kernelfleet_sample_stale" in a]
        assert stale and all("hostname=~" in a for a in stale)  # never the whole fleet's vector
        # 12 rows: a host and a half of 8, and the cursor's host, at most 3 hosts a read
        assert all(len(re.search(r'hostname=~"([^"]*)"', a).group(1).split("|")) <= 3 for a in stale)
        after = body["next_after"]
        if after is None:
            break
    assert [g["uuid"] for g in rows] == [g["uuid"] for g in whole]
    assert [r["bottleneck"] for r in rows] == [g["bottleneck"] for g in whole]
    assert len({g["uuid"] for g in rows}) == GPUS


def test_a_page_of_every_host_reads_the_fleets_vectors_unfiltered(past_day):
    """A page that holds every host (?limit=1000 of a fleet of up to 1,000 GPUs) asks for the whole
    vectors: a hostname=~ of every host and a uuid=~ of every uuid cost Prometheus more than those."""
    backend, asked = watched(past_day)
    whole = backend.gpus()
    asked.clear()
    body = TestClient(create_app(backend)).get("/api/gpus", params={"limit": 1000}).json()
    assert body["total"] == GPUS and body["next_after"] is None
    assert [(g["uuid"], g["bottleneck"], g["jobs"]) for g in body["gpus"]] == \
        [(g["uuid"], g["bottleneck"], g["jobs"]) for g in whole]
    assert any("query=kernelfleet_sample_stale" in a for a in asked)
    assert not [a for a in asked if "=~" in a]  # no host's or uuid's regex
