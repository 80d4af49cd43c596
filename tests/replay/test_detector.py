"""The regression detector on H200 recordings (bench/record_detector_traces.py) and on noise."""

import json
import random
from pathlib import Path

import pytest
from recorded import at_end_of

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
    assert event.baseline_ofu == pytest.approx(0.679, abs=0.005)  # f_ref 2027 MHz (1830 / 0.903)
    # raised as soon as the suspect window's median crosses 0.7x, before it settles at 0.27
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


def test_a_data_parallel_slowdown_is_flagged_on_both_gpus_and_for_the_job(tmp_path):
    """Two H200s, one DDP job (bench/record_ddp_regression.py): 40 s clean, then 40 s with a
    per-step loss.item() and a 20-ms input stall on rank 1, which NCCL passes on to rank 0."""
    from kernelfleet.fleet.agent import Agent
    from kernelfleet.fleet.attribution import JobIdentity
    from kernelfleet.fleet.store import Store

    data = Path(__file__).parents[1] / "data" / "h200x2-detector"
    phases = json.loads((data / "h200x2-ddp.phases.json").read_text())
    ranks = {r["pid"]: r for r in phases["ranks"]}
    slow_from = min(r["slow"]["start"] for r in ranks.values())
    assert min(r["slow"]["step_ms"] / r["clean"]["step_ms"] for r in ranks.values()) > 2.5  # what the job itself saw

    def identify(process):  # the recording's PIDs are the ranks' (KERNELFLEET_JOB was set on them)
        job = phases["job"] if process.pid in ranks else None
        return JobIdentity(process.pid, job, "label", None, None, None, None, None, None, None)

    store = Store(tmp_path / "kf.db")
    agent = Agent(ReplaySource(data / "h200x2-ddp.jsonl.gz"), store, Catalog.load(), identify=identify,
                  clock=at_end_of(data / "h200x2-ddp.jsonl.gz"))
    for batch in agent.source.batches():
        assert len(batch) == 2
        agent.step(batch)
    events = store.events()
    assert {e["kind"] for e in events} == {"regression"}
    flagged = {e["uuid"] or e["job"]: e["ts"] for e in events}
    assert len(flagged) == 3 and phases["job"] in flagged  # both GPUs and the job, once each
    for ts in flagged.values():
        assert 0 < ts - slow_from < 20  # within 20 windows of the stall starting, none before it
    store.close()
