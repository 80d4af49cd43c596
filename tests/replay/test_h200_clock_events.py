"""The clock-event stream an H200 (driver 580) gave (tests/data/h200/clock-events.json, recorded by
``bench.clock_event_probe`` on 2026-12-01): why the sampler polls by default. Idle, events came
about every 100 ms with the clock still; under a bf16 GEMM loop, many times more events than clock
changes, and a third of the changes with no event at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.clock_event_probe import ClockEventRecording, coverage

pytestmark = pytest.mark.replay

RECORDING = Path(__file__).resolve().parents[1] / "data" / "h200" / "clock-events.json"


def test_the_h200_sends_clock_events_that_do_not_announce_its_clock_changes():
    recording = ClockEventRecording.model_validate_json(RECORDING.read_text())
    assert recording.driver == "580.159.04" and "H200" in recording.gpus[0]
    idle, load = (coverage(phase) for phase in recording.phases)
    assert "idle" in idle.label and "GEMM" in load.label
    assert idle.events > 30 and idle.clock_changes <= 2  # ~10 a second with the clock still
    assert load.events > 5 * load.clock_changes and load.unexplained_events > 150
    assert 0 < load.announced < load.clock_changes  # some changes came with no event
