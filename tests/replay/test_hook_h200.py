"""kernelfleet.hook on a real GPU job against the real agent (bench/hook_check.py, run on an H200 by
``bash bench/ofu_h200_check.sh`` on 2026-11-30; its files in tests/data/h200-hook/, the agent's store
exported, agent.db left out).

A bf16 MLP whose GEMMs are no tile multiples (tokens 8200, widths 1000 and 3000) trains with
``Tracker`` in two phases: (a) the job reports its honest MFU, (b) twice that. Each phase's first
counted step is profiled for the tile correction. Measured: the agent flagged 9 of 9 reports of (b)
and none of (a); over (a)'s 20 steady windows the corrected OFU the agent computed then (f_ref
1980 MHz) was 0.423 against an event-timed MFU of 0.420 (+0.34 pp). Recomputed from the same
counters with today's catalog (f_ref 2027 MHz for bf16, the probe's 0.903) it is 0.413 (−0.63 pp):
the steady-loop clock ratio is a little low for a job whose windows also hold non-GEMM kernels
(docs/validation/ofu.md, "The hook on a real job"). Margins: the phase's mean corrected OFU within
1 pp of MFU and every steady window within 2 pp; the agent flags every report of (b), none of (a)
(its margin is 10 pp).
"""

import gzip
import json
import statistics
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.hook import Launch, gemm_dims, padding_flops
from kernelfleet.ofu import ofu
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel, tile_from_kernel_name
from kernelfleet.telemetry.sample import Sample
from kernelfleet.validation.mfu import point_windows

pytestmark = pytest.mark.replay
DATA = Path(__file__).parents[1] / "data" / "h200-hook"
H200 = Catalog.load().get("h200-sxm")
PHASE_MARGIN_PP, WINDOW_MARGIN_PP = 1.0, 2.0
RUN_F_REF_HERTZ = 1.98e9  # the H200's f_ref in the catalog the agent ran with (before the per-pipe clock)


@pytest.fixture(scope="module")
def run():
    return json.loads((DATA / "hook-run.json").read_text())


@pytest.fixture(scope="module")
def reports():
    return [json.loads(line) for line in (DATA / "hook-reports.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def events():
    return json.loads((DATA / "agent-events.json").read_text())["events"]


@pytest.fixture(scope="module")
def windows():
    return [json.loads(line) for line in (DATA / "agent-windows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def samples(windows):
    """The agent's stored windows as the counter samples they came from (the fields OFU needs)."""
    return [Sample(timestamp_seconds=w["ts"], window_seconds=w["window_seconds"], gpu_index=0, uuid=w["uuid"],
                   name=w["name"], tensor_active_ratio=w["tensor_active"], sm_clock_mean_hertz=w["sm_clock_hertz"])
            for w in windows if not w["stale"]]


@pytest.fixture(scope="module")
def timelines():
    with gzip.open(DATA / "hook-timeline.json.gz", "rt") as f:
        return {t["name"]: t for t in json.load(f)["phases"]}


def flagged(report, events) -> bool:
    """The agent writes its mfu-mismatch event while it answers the report."""
    return any(e["kind"] == "mfu-mismatch" and report["sent_wall"] <= e["ts"] <= report["answered_wall"] for e in events)


def test_a_bf16_job_on_an_h200_against_the_agent(run):
    assert not run["dry_run"] and "H200" in run["device"]
    assert run["agent_path"].startswith("kernelfleet agent") or "NvmlSource" in run["agent_path"]
    assert [p["name"] for p in run["phases"]] == ["honest", "doubled"]


def test_the_hook_counts_the_models_flops(run):
    s = run["shape"]
    assert run["useful_flops_per_step"] == 2 * s["tokens"] * s["width"] * s["hidden"] * (6 * s["blocks"] - 1)
    assert run["hooked_flops_per_step"] == {"bf16": run["useful_flops_per_step"]}


def test_the_profiled_steps_pair_every_matmul_with_the_gemm_kernel_that_ran_it(run):
    for phase in run["phases"]:
        p = phase["profiled"]
        assert p["problem"] is None and p["tracker_note"] is None
        assert len(p["calls"]) == len(p["gemm_pairs"]) == 6 * run["shape"]["blocks"] - 1
        assert all(tile_from_kernel_name(pair["kernel"]) for pair in p["gemm_pairs"])
        # The hook's own pairing replayed on the recorded calls and kernels gives the Tracker's figures.
        calls = [(op, tuple(tuple(s) for s in shapes), precision) for op, shapes, precision in p["calls"]]
        padding = padding_flops(calls, [Launch(op, kernel) for op, kernel in p["launches"]])
        useful, executed = p["tracker_useful_flops"], p["tracker_executed_flops"]
        assert useful == {"bf16": run["useful_flops_per_step"]}
        assert executed == {"bf16": useful["bf16"] + padding["bf16"]}
        assert executed["bf16"] == sum(pair["executed"] for pair in p["gemm_pairs"])
        for pair in p["gemm_pairs"]:
            batch, m, n, k = gemm_dims(pair["op"], pair["shapes"])
            assert pair["executed"] == executed_flops_of_kernel(m, n, k, pair["kernel"], batch)
        assert all(pair["executed"] > pair["useful"] for pair in p["gemm_pairs"])  # no tile multiples


def test_every_report_carries_the_correction_and_the_agent_applies_it(run, reports):
    executed = {p["name"]: p["profiled"]["tracker_executed_flops"] for p in run["phases"]}
    assert len(reports) >= 12
    for r in reports:
        body, answer = r["body"], r["answer"]
        assert body["executed_flops"] == executed[r["phase"]] and body["correction_note"] is None
        assert answer["correction_note"] is None and answer["gpus"] == 1.0
        scale = body["profiled_useful_flops"]["bf16"] / body["executed_flops"]["bf16"]
        assert answer["corrected_ofu_ratio"] == pytest.approx(answer["ofu_ratio"] * scale, rel=1e-12)


def test_the_agents_windows_are_ofu_from_their_counters(windows, samples):
    """The agent stored OFU at the f_ref of its day; today's catalog divides the same counters by the
    HMMA pipe's f_ref (the store keeps no per-pipe split, so that is the one OFU takes)."""
    stored = [w["ofu"] for w in windows if not w["stale"]]
    assert [s.tensor_active_ratio * s.sm_clock_mean_hertz / RUN_F_REF_HERTZ for s in samples] == pytest.approx(stored, rel=1e-12)
    now = [ofu(s, H200).ofu_ratio for s in samples]
    assert now == pytest.approx([o * RUN_F_REF_HERTZ / H200.ofu_reference_clock("hmma")[0] for o in stored], rel=1e-12)
    assert {ofu(s, H200).reference_for for s in samples} == {"hmma"}


def test_corrected_ofu_matches_the_event_timed_mfu_over_the_same_windows(run, timelines, samples):
    for phase in run["phases"]:
        timeline = timelines[phase["name"]]
        p = phase["profiled"]
        scale = p["tracker_useful_flops"]["bf16"] / p["tracker_executed_flops"]["bf16"]
        steady = [(mfu, raw) for s, mfu, raw in point_windows(timeline, samples, H200)
                  if s.timestamp_seconds - s.window_seconds >= timeline["steady_from_wall"]]
        assert len(steady) >= 10, phase["name"]
        mfu = statistics.mean(m for m, _ in steady)
        corrected = statistics.mean(r * scale for _, r in steady)
        assert mfu > 0.2  # a 2x counting bug then moves the reported MFU by more than the agent's 10 pp
        assert abs(corrected - mfu) * 100 <= PHASE_MARGIN_PP, phase["name"]
        assert (corrected - mfu) * 100 == pytest.approx(-0.64, abs=0.05), phase["name"]  # -0.63 (a), -0.65 (b)
        assert all(abs(r * scale - m) * 100 <= WINDOW_MARGIN_PP for m, r in steady), phase["name"]
        # the correction moves OFU towards MFU
        assert statistics.mean(abs(r * scale - m) for m, r in steady) < statistics.mean(abs(r - m) for m, r in steady)


def test_the_agent_flags_the_doubled_mfu_and_not_the_honest_one(reports, events):
    honest = [r for r in reports if r["phase"] == "honest"]
    doubled = [r for r in reports if r["phase"] == "doubled"]
    assert len(honest) >= 6 and len(doubled) >= 6
    assert not any(flagged(r, events) for r in honest)
    assert all(flagged(r, events) for r in doubled)
    mismatches = [e for e in events if e["kind"] == "mfu-mismatch"]
    assert len(mismatches) == len(doubled) and all("tile-corrected OFU" in e["detail"] for e in mismatches)
    # what the honest job reported is what the agent measured, to within its margin
    assert all(abs(r["body"]["reported_mfu"] - r["answer"]["corrected_ofu_ratio"]) <= 0.10 for r in honest)


def test_the_honest_phase_as_measured(run, timelines, samples):
    """The numbers docs/validation/ofu.md quotes, and what the run itself printed (summary.json)."""
    (honest,) = [p for p in run["phases"] if p["name"] == "honest"]
    p = honest["profiled"]
    assert p["tracker_executed_flops"]["bf16"] / p["tracker_useful_flops"]["bf16"] == pytest.approx(1.0542, abs=1e-4)
    assert honest["event_mfu_ratio"] == pytest.approx(0.4202, abs=1e-4)
    timeline = timelines["honest"]
    steady = [(mfu, raw) for s, mfu, raw in point_windows(timeline, samples, H200)
              if s.timestamp_seconds - s.window_seconds >= timeline["steady_from_wall"]]
    mfu = statistics.mean(m for m, _ in steady)
    raw = statistics.mean(r for _, r in steady)
    assert len(steady) == 20 and mfu == pytest.approx(0.4198, abs=1e-4)
    assert (raw - mfu) * 100 == pytest.approx(1.61, abs=0.01)
    assert (raw / 1.0542 - mfu) * 100 == pytest.approx(-0.63, abs=0.01)
    # at the run's f_ref (1980 MHz) the same windows read +0.34 pp, as the run printed
    then = json.loads((DATA / "summary.json").read_text())["phases"]["honest"]
    assert then["corrected_minus_mfu_pp"] == pytest.approx(0.34, abs=0.01)
    assert then["corrected_minus_mfu_pp"] == pytest.approx(
        (raw * H200.ofu_reference_clock("hmma")[0] / RUN_F_REF_HERTZ / 1.0542 - mfu) * 100, abs=0.01)
