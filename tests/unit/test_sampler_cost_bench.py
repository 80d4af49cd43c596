"""bench/sampler_cost.py end to end on the NVML CPU twin: every mode runs, the old path is the old
one, the JSON is written and is the last line; the event probe reads what the driver offers."""

import json
import sys

import pytest
from nvml_twin import Twin, TwinGpu

from bench import sampler_cost
from kernelfleet.telemetry.nvml_api import Nvml

pytestmark = pytest.mark.unit


def test_twin_run_writes_every_mode_and_the_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["sampler_cost", "--twin", "--windows", "1", "--repeat", "1", "--reps", "50",
                                      "--interval", "0.2", "--out", str(tmp_path)])
    sampler_cost.main()
    out = capsys.readouterr().out.splitlines()
    written = json.loads((tmp_path / "sampler_cost.json").read_text())
    assert json.loads(out[-1]) == written and out[0].startswith("command: ")
    assert [r["mode"] for r in written["rows"]] == ["before", "after", "floor", "dense"]
    by_mode = {r["mode"]: r for r in written["rows"]}
    # the twin's clock moves every read: adaptive modes poll every 100 ms like dense, floor once a window
    assert by_mode["before"]["clock_reads_per_window"] == by_mode["dense"]["clock_reads_per_window"] == 2
    assert by_mode["floor"]["clock_reads_per_window"] == 1
    assert by_mode["floor"]["clock_p95_error_ratio"] > by_mode["dense"]["clock_p95_error_ratio"]
    assert set(written["after_over_before"]) == {"twin, moving"}
    assert [p["part"] for p in written["parts_us"]][1] == "SM clock read"


def test_before_is_the_pynvml_path_with_every_field_every_window():
    source, _ = sampler_cost.make_source("before", 1.0, None)
    assert (source.hot_reads, source.slow_health_seconds) == (False, 0.0)
    after, _ = sampler_cost.make_source("after", 1.0, None)
    assert after.hot_reads and after.slow_health_seconds > 0
    floor, _ = sampler_cost.make_source("floor", 2.0, None)
    assert floor.clock_poll_seconds == 2.0 and not floor.adaptive_clock_poll


def test_event_probe_says_whether_clock_events_exist(fake_time):
    probe = sampler_cost.clock_event_probe(Nvml(Twin([TwinGpu()], fake_time.now)))
    assert probe == {"supported_event_types": "0xb", "clock_change_events": False}
    gone = TwinGpu(lost=True)
    probe = sampler_cost.clock_event_probe(Nvml(Twin([gone], fake_time.now)))
    assert probe["clock_change_events"] is None and "NVML code 15" in probe["error"]
