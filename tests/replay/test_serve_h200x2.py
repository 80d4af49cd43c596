"""`kernelfleet bench serve llama8b-prefill` on two H200s (tests/data/h200x2-serve), replayed on the CPU.

The recorded run: Poisson requests at 2, 4, 6 and 8 per second, 5 s each, served by the latency
plan, the throughput plan (3 slots, chained), request distribution (3 slots, free) and the monitor
switching between the first two; p99 target 1 s (docs/place.md, "Online serving and the monitor").
"""

import json
from pathlib import Path

import pytest

from kernelfleet.bench.serve import slo_capacity

pytestmark = pytest.mark.replay

RUN = json.loads((Path(__file__).parents[1] / "data" / "h200x2-serve" / "llama8b-prefill.serve.json").read_text())
ROWS = {(r["rate_per_second"], r["mode"]): r for r in RUN["runs"]}


def test_every_request_was_served_once_with_its_single_device_outputs():
    assert {g["gate"] for g in RUN["graphs"].values()} == {"identical"}
    assert RUN["corrupted"] == 0
    for row in RUN["runs"]:
        assert row["served"] == row["arrivals"] > 0 and row["dropped"] == row["corrupted"] == 0, row


def test_the_slo_capacity_is_what_the_rows_say():
    assert slo_capacity(RUN["runs"], RUN["slo_ms"]) == RUN["slo_capacity"]
    assert RUN["slo_capacity"] == {"latency": 4.0, "throughput": 6.0, "replicas": 8.0, "monitor": 6.0}


def test_the_monitor_keeps_the_latency_plan_at_light_load_and_switches_under_load():
    light = ROWS[2.0, "monitor"]
    assert light["switches"] == 0 and set(light["launches"]) == {"latency"}
    assert light["p99_ms"] <= ROWS[2.0, "latency"]["p99_ms"] * 1.1
    for rate in (6.0, 8.0):  # past the latency plan's 4.96 requests/s
        busy = ROWS[rate, "monitor"]
        assert busy["switches"] >= 1 and busy["launches"]["throughput"] > 0
        assert busy["p99_ms"] < 0.7 * ROWS[rate, "latency"]["p99_ms"]
