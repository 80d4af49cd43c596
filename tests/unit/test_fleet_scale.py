"""``python -m bench.fleet_scale --quick`` as CI runs it: it finishes, prints its table and command,
and its last line is JSON with every figure, each sane (behaviour, not speed: no figure is held to
a target here; the targets are the benchmark's to report)."""

import pytest
from recorded import bench_quick

pytestmark = pytest.mark.unit
ENDPOINTS = {"/api/fleet", "/api/overview", "/api/overview (2 hosts open)", "/api/gpus", "/api/jobs", "/api/jobs/summary", "/api/events",
             "/api/jobs/JOB (a job of 8 GPUs)", "/api/series (15 min raw)", "/api/series (24 h at 1 min)",
             "/api/fleet/series (24 h)"}


@pytest.fixture(scope="module")
def quick() -> tuple[str, dict]:
    return bench_quick("fleet_scale", timeout_seconds=600)


def test_the_table_names_its_command_and_every_endpoint(quick):
    table, figures = quick
    assert f"command: {figures['command']}" in table and figures["command"].endswith("-m bench.fleet_scale --quick")
    for name in ENDPOINTS:
        assert name in table


def test_writes_are_measured_against_the_bare_wal_floor(quick):
    _, figures = quick
    assert set(figures["writes"]) == {"8", "64"}
    for gpus, w in figures["writes"].items():
        assert w["rows_per_second"] > 0 and w["bare_wal_rows_per_second"] > 0
        # the ratio is of CPU seconds, store and floor interleaved window by window; wall clock beside it
        assert w["ratio"] == pytest.approx(w["bare_wal_cpu_us_per_window"] / w["cpu_us_per_window"])
        assert w["cpu_us_per_window"] > 0 and w["wall_ratio"] > 0
        assert len(w["wall_minute_ratios"]) == 3 * -(-{"8": 120, "64": 60}[gpus] // 60)
        assert min(w["wall_minute_ratios"]) <= w["wall_minute_ratio_median"] <= max(w["wall_minute_ratios"])
        assert 40 < w["bytes_per_gpu_window"] < 1000  # a narrow row, its share of the rollups, a page's slack
        assert w["attempts"] == 3 and w["load_average_1m"] >= 0  # best of three, beside the machine's load
    assert figures["write_ratio_to_bare_wal"] == min(w["ratio"] for w in figures["writes"].values())


def test_every_endpoint_has_a_p50_below_its_p95_on_both_stores(quick):
    _, figures = quick
    assert [(e["gpus"], e["days"]) for e in figures["embedded"]] == [(8, 2.0), (64, 1 / 24)]
    for e in figures["embedded"] + figures["prometheus"]:
        assert ENDPOINTS <= set(e["endpoints_ms"])
        for p50, p95 in e["endpoints_ms"].values():
            assert 0 < p50 <= p95
    for e in figures["embedded"]:
        assert e["store_bytes"] > 0 and e["sampler_windows"] == 3 and 0 <= e["sampler_windows_missed"] <= 3
        assert e["endpoints_ms"]["/healthz"][0] > 0


def test_prometheus_endpoints_stand_beside_their_promql_floor(quick):
    _, figures = quick
    (p,) = figures["prometheus"]
    assert p["gpus"] == 20 and p["step_seconds"] == 60
    assert p["instant_series_seconds"] == 7200 and p["backfill_workers"] >= 1 and p["tsdb_bytes"] > 0
    assert p["text_seconds"] <= p["backfill_seconds"]
    assert set(p["promql_floor_ms"]) == set(p["endpoints_ms"])
    # the paged /api/gpus beside the unpaged answer it replaced, each with its own floor
    assert {"/api/gpus?limit=1000", "every GPU's row in one answer (the unpaged /api/gpus before)"} <= set(p["endpoints_ms"])
    assert all(floor > 0 for floor in p["promql_floor_ms"].values())
