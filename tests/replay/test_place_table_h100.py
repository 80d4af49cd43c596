"""The whole placement table made again on one H100 (2026-12-06, in two calls of ``bash
bench/pending_run.sh place-table``, that is ``bench.place_pairs --resume``), with the model as it
stands: every target on both pairs, profile timing each device's graph alone, free, while the other
loops, and, on the same-kernel pair, the pair's two graphs launched together once. Kept in
tests/data/h100-place-table; to see it: ``python -m bench.place_table tests/data/h100-place-table``
(docs/validation/place-h200-pairs.md, "The whole table again, on an H100")."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench import place_calibration, place_table
from kernelfleet.costs.table import CostTable
from kernelfleet.plan.contention import Contention

pytestmark = pytest.mark.replay

RUN = Path(__file__).parents[1] / "data" / "h100-place-table"
FOLDERS = sorted(p.parent for p in RUN.glob("*/disagg.json"))
SAME = [f for f in FOLDERS if f.name.endswith(".same")]
DIFFERENT = [f for f in FOLDERS if f.name.endswith(".different")]


@pytest.fixture(scope="module")
def rows():
    return {f.name: place_table.row_of(f) for f in FOLDERS}


def replicas_off(folder: Path) -> float:
    """Request distribution's measured time over its prediction, less 1."""
    replicas = json.loads((folder / "disagg.json").read_text())["strategies"]["replicas"]
    return replicas["seconds"] / replicas["predicted_seconds"] - 1


def test_the_table_was_made_on_an_h100_in_two_resumed_calls():
    cards = (RUN / "smi.txt").read_text().splitlines()[1::2]
    assert len(cards) == 2 and all(card.startswith("NVIDIA H100 80GB HBM3") for card in cards)
    run = json.loads((RUN / "runs.json").read_text())
    assert run["command"].count("bench.place_pairs --out /tmp/place-table --resume") == 2
    assert len(run["rows"]) == 22 and run["not_run"] == []
    assert len(SAME) == len(DIFFERENT) == 11


def test_every_target_is_met_but_the_latency_plan_on_four_ties_between_the_two_devices(rows):
    """The choice is within 3 % of the best on all 22 rows (worst mamba-decode on the different-kernel
    pair, 1.025x) and all 145 chained predictions within 10 %. The latency plan is one device on every
    row, and on four of the same-kernel pair (a 64 SMs, b 32; steps of 2-10 µs kernels, which run
    alike on both) the other device ran 0.01-1.1 % faster, where the model had it 0.04-1.2 % slower."""
    assert max(r.chosen_over_best for r in rows.values()) < 1.026
    assert sum(r.predictions_within for r in rows.values()) == sum(r.predictions for r in rows.values()) == 145
    missed = {name: r for name, r in rows.items() if r.latency_over_single > 1}
    assert sorted(missed) == ["dit-denoise.same", "llama-prefill.same", "moe-decode.same", "vlm-prefill.same"]
    assert all(r.latency_tie for r in missed.values()) and max(r.latency_over_single for r in missed.values()) < 1.012
    verdicts = place_table.verdicts(list(rows.values()))
    assert verdicts["chosen within 3 % of the best"] == "met on every row"
    assert verdicts["latency plan at or below the fastest single device"] == (
        "missed on 4 of 22 rows (worst 1.011x; 4 of them one device, predicted within 3 % of the other: a tie the "
        "graph times cannot settle)")


def test_the_h200_recording_as_it_ran_missed_what_this_table_meets(rows):
    """The H200's table (2026-12-01, before the copy queue, the 5 % latency margin and the together
    graph) chose over 3 % from the best on 3 rows, up to 1.79x, and had 138 of 147 predictions within 10 %."""
    h200 = [place_table.row_of(f) for f in sorted(p.parent for p in place_table.RECORDED.glob("*/disagg.json"))]
    assert sum(r.chosen_over_best > 1 + place_table.CHOSEN_WITHIN for r in h200) == 3
    assert (sum(r.predictions_within for r in h200), sum(r.predictions for r in h200)) == (138, 147)
    assert sorted(r.target + "." + r.pair for r in h200) == sorted(rows)


def test_request_distribution_is_predicted_closest_where_profile_timed_the_pair_together():
    """Same-kernel pair: profile launched the two graphs together (1.08-1.15x the slower alone) and
    request distribution ran -0.2 % to +3.6 % off its prediction. Different-kernel pair: the per-device
    profile timed the together graph too but did not keep it (it does since), so request distribution
    took the looping factors and ran 0.1-8.6 % faster than predicted."""
    for folder in SAME:
        costs = CostTable.from_json((folder / "costs.json").read_text(), str(folder))
        assert 1.08 < costs.graph_seconds_together / max(costs.graph_seconds[d] for d in "ab") < 1.16
        assert -0.003 < replicas_off(folder) < 0.037, folder.name
    for folder in DIFFERENT:
        assert CostTable.from_json((folder / "costs.json").read_text(), str(folder)).graph_seconds_together is None
        assert -0.087 < replicas_off(folder) < 0, folder.name
    assert min(map(replicas_off, DIFFERENT)) < -0.08


def test_with_the_together_graph_mamba_decodes_choice_on_the_different_pair_is_the_best():
    """bench disagg's request distribution is the together graph profile now keeps for the
    different-kernel pair; standing in for it (in-sample: the measurement the prediction then meets),
    mamba-decode's choice moves from one device with free slots (1.025x the best, the table's worst) to
    request distribution, the best."""
    folder = RUN / "mamba-decode.different"
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    costs = place_calibration.profiled(folder)
    table = place_calibration.corrected(costs, costs.graph_seconds, "contention")
    together = replace(table, graph_seconds_together=found["replicas"]["seconds"])
    timed = place_calibration.slot_strategies(folder, together)
    predicted = place_calibration.predictions(folder, together, Contention.of(together), timed)
    again = {n: {**r, "predicted_seconds": predicted.get(n, r.get("predicted_seconds"))} for n, r in found.items()}
    before, after = place_table.row_of(folder), place_table.row_of(folder, again)
    assert (before.chosen, round(before.chosen_over_best, 3)) == ("single:a, slots free", 1.025)
    assert (after.chosen, after.chosen_over_best) == ("replicas", 1.0) and after.predictions_within == 6


def test_placement_beats_request_distribution_only_where_the_second_device_runs_slower_kernels(rows):
    """Different-kernel pair: the best placement runs 1.12-1.38x request distribution's rate on the 9
    rows with attention (b's math attention is slower; one device with free slots is the placement);
    the two Mamba rows tie. Same-kernel pair: 0.98-1.01x."""
    different = {r.target: r.placement_over_replicas for r in rows.values() if r.pair == "different"}
    assert all(1.12 < x < 1.39 for t, x in different.items() if "mamba" not in t)
    assert all(0.98 < x < 1.0 for t, x in different.items() if "mamba" in t)
    assert all(0.98 < r.placement_over_replicas < 1.02 for r in rows.values() if r.pair == "same")


def test_every_strategy_passed_its_gate(rows):
    """Bit for bit on the same-kernel pair; on the different-kernel pair mixed strategies of the
    attention models within the tolerance gate (the Mamba and vlm rows place no mixed strategy there
    that differs from one device's kernels)."""
    assert all(r.gates == "identical" for r in rows.values() if r.pair == "same")
    tolerant = sorted(r.target for r in rows.values() if r.gates == "identical, within tolerance")
    assert tolerant == ["hf-llama-decode", "hf-llama-prefill", "hf-qwen2moe-decode", "llama-decode", "llama-prefill",
                        "moe-decode"]
