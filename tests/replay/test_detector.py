"""The regression detector on H200 recordings (bench/record_detector_traces.py) and on noise."""

import random
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.detect import RegressionDetector
from kernelfleet.ofu import ofu
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.replay
DATA = Path(__file__).parents[1] / "data" / "h200-detector"
H200 = Catalog.load().get("h200-sxm")


def run(samples, detector=None):
    detector = detector or RegressionDetector()
    events = []
    for i, s in enumerate(samples):
        event = detector.observe("gpu0", s.timestamp_seconds, ofu(s, H200).ofu_ratio, s.sm_active_ratio)
        if event:
            events.append((i, event))
    return events


def trace(name):
    return [b[0] for b in ReplaySource(DATA / f"h200-{name}.jsonl.gz").batches()]


def test_a_2_5x_drop_is_flagged_within_60_windows():
    samples = trace("drop")
    drop_at = next(i for i, s in enumerate(samples) if i > 10 and ofu(s, H200).ofu_ratio < 0.62)
    events = run(samples)
    assert [e.kind for _, e in events] == ["regression"]
    (index, event), = events
    assert 0 < index - drop_at < 60  # measured: 11 windows
    assert event.baseline_ofu == pytest.approx(0.694, abs=0.005)
    # raised as soon as the suspect window's median crosses 0.7x, before it settles at 0.274
    assert event.current_ofu < 0.7 * event.baseline_ofu


def test_checkpoint_pauses_raise_nothing():
    assert run(trace("gaps")) == []


def test_the_clean_part_of_a_run_raises_nothing():
    samples = trace("drop")
    assert run(samples[:47]) == []


def test_steady_noise_raises_nothing_and_a_recovery_closes_a_regression():
    rnd = random.Random(7)
    noisy = [0.69 * (1 + rnd.uniform(-0.2, 0.2)) for _ in range(400)]
    detector = RegressionDetector()
    assert [detector.observe("k", t, v, 0.97) for t, v in enumerate(noisy)].count(None) == 400
    slow = [detector.observe("k", 400 + t, 0.3, 0.3) for t in range(40)]
    back = [detector.observe("k", 440 + t, 0.69, 0.97) for t in range(40)]
    assert [e.kind for e in slow + back if e] == ["regression", "recovery"]
