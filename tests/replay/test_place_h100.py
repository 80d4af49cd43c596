"""The place runs left waiting for a GPU, made on one H100 in five calls on 2026-12-06 (``bash
bench/pending_run.sh place``; each call's ``nvidia-smi`` line in its pairs folder's smi.txt).

The first call: the link on the H100's two partitions (tests/data/h100-link), Qwen2-MoE decode's edge
plans (tests/data/h100-edges) and the two same-kernel rows that had missed their prediction on the H200
(tests/data/h100-place-pairs). The later call: the same link and edge plans again
(tests/data/h100-link-2, tests/data/h100-edges-2), hf-mamba-decode's same-kernel row again, and
hf-qwen2moe-prefill's, the H200's last row off its prediction (tests/data/h100-place-pairs-2). The
third call (a later session): all of it again (tests/data/h100-{link,edges,place-pairs}-3). The fourth:
the two rows again once ``bench disagg`` captured each device's slots together (tests/data/h100-place-pairs-4).
The fifth, in the session after: all of it again, profile timing the two devices' graphs together.

* Every edge plan of Qwen2-MoE decode ran and passed the bit-exact gate, in both calls. On the H200
  (2026-12-02) those plans faulted the GPU: an ``aten.sort`` split across the devices read its workspace's
  pointer words stale. Since 2026-12-05 such op calls stay whole (tests/replay/test_sort_workspace_h200.py),
  and here plans that put the sorts on b and their inputs' writers on a ran right.
* Every row's chained plans are within 10 % of their prediction, and all but one row choose within 3 %
  of the best. hf-mamba-decode's pipeline, 15.6 % faster than predicted on the H200, is within 3 % here
  in the first two calls, with 6 copies a slot; in the third its cut had 16, and it ran 7.9 % faster than
  predicted, within 2.3 % with the call's measured link: today's 4 µs a copy is what overcharges it
  (docs/validation/place-h200-pairs.md).
* Qwen2-MoE prefill missed the choice target on the H100 in both calls that ran it before the fourth: the
  model chose one device with free slots, which ran 11.6 % and 8.5 % slower than predicted, over request
  distribution, which ran 7.1 % and 9.3 % faster. The free slots' gap was ``bench disagg``'s memory
  layout (its captures of a and b interleaved); with each device's slots captured together (the fourth
  call) they ran as predicted and the choice is within 0.1 % of the best, but request distribution, now
  10.7 % faster than predicted, is that row's one prediction outside 10 %.
* The fifth call (a later session, tests/data/h100-{link-4,edges-4,place-pairs-5}): profile now also
  times the pair's two graphs launched together once. Request distribution is then predicted within
  0.1 % (Qwen2-MoE prefill) and 0.9 % (Mamba). Mamba chooses the best exactly, and its latency plan,
  split across the devices for the first time, runs 0.96x the fastest single device, 11.9 % slower than
  predicted. Qwen2-MoE prefill has every prediction within 10 % but misses the choice by 3.8 %: two
  candidates predicted 0.55 % apart, and profile's free graph on a 3.4 % above its three calls before.
"""

import json
from pathlib import Path

import pytest

from bench import place_table
from kernelfleet.costs.links import LinkTable
from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.edgerun import EdgeRun, edge_plans
from kernelfleet.plan.transfers import transfers

pytestmark = pytest.mark.replay

DATA = Path(__file__).parents[1] / "data"
PAIRS, LATER, THIRD = DATA / "h100-place-pairs", DATA / "h100-place-pairs-2", DATA / "h100-place-pairs-3"
FOURTH = DATA / "h100-place-pairs-4"  # the two rows only, bench disagg capturing each device's slots together
FIFTH = DATA / "h100-place-pairs-5"  # all again, profile timing the pair's graphs launched together
EDGES = DATA / "h100-edges"
# per call: its pairs, edge plans and link
CALLS = {"first": (PAIRS, EDGES, DATA / "h100-link"), "later": (LATER, DATA / "h100-edges-2", DATA / "h100-link-2"),
         "third": (THIRD, DATA / "h100-edges-3", DATA / "h100-link-3"),
         "fifth": (FIFTH, DATA / "h100-edges-4", DATA / "h100-link-4")}
FOLDERS = sorted(p.parent for pairs in (PAIRS, LATER, THIRD, FOURTH, FIFTH) for p in pairs.glob("*/disagg.json"))
FIFTH_MAMBA, FIFTH_PREFILL = FIFTH / "hf-mamba-decode.same", FIFTH / "hf-qwen2moe-prefill.same"
PREFILL = LATER / "hf-qwen2moe-prefill.same"  # the row whose choice misses (tests below), in both calls
PREFILLS = (PREFILL, THIRD / "hf-qwen2moe-prefill.same")


def row_id(folder: Path) -> str:
    return f"{folder.parent.name}/{folder.name}"


def strategies(folder: Path) -> dict:
    return json.loads((folder / "disagg.json").read_text())["strategies"]


def off(strategy: dict) -> float:
    """Measured over predicted, less 1."""
    return strategy["seconds"] / strategy["predicted_seconds"] - 1


@pytest.mark.parametrize("pairs, edges, link", CALLS.values(), ids=CALLS)
def test_the_runs_were_made_on_an_h100(pairs, edges, link):
    assert (pairs / "smi.txt").read_text().splitlines()[1].startswith("NVIDIA H100 80GB HBM3")
    run = EdgeRun.load(edges / "edges.json")
    assert "NVIDIA H100 80GB HBM3" in run.source and not run.derived
    assert "NVIDIA H100 80GB HBM3" in json.dumps(json.loads((link / "links.json").read_text()))


@pytest.mark.parametrize("edges", [edges for _, edges, _ in CALLS.values()], ids=CALLS)
def test_every_qwen2moe_decode_edge_plan_ran_and_passed_the_bit_exact_gate(edges):
    run = EdgeRun.load(edges / "edges.json")
    program = Program.load(edges / "hf-qwen2moe-decode" / "program.json.gz")
    made = edge_plans(program, "a", "b")
    assert run.refused == [] and sorted(p.name for p in run.plans) == sorted(name for name, _, _ in made)
    assert all(p.gate == "identical" and p.measured_seconds for p in run.plans)
    # as the plan that faulted on the H200 did, plans here copied what a sort reads from the other device
    sorts = {launch.index for launch in program.launches if launch.op == "aten.sort.default"}
    assert len(sorts) == 10  # two calls of five launches each
    fed = [name for name, _, assignment in made
           if any(t.reader in sorts for t in transfers(program, assignment, "a", True))]
    assert len(fed) >= 4, fed  # 6 of the 14


def test_the_edge_plans_ran_as_far_off_their_prediction_in_every_call():
    """The 12 plans with copies, against today's model (4 µs + bytes at 25 GB/s a copy): -0.4 % to
    +8.7 % in the first call, -0.5 % to +9.6 % in the later one, -0.8 % to +8.7 % in the third, -1.1 %
    to +9.1 % in the fifth; the worst is cut 5 every time."""
    for edges, low, high in ((EDGES, -0.004, 0.088), (CALLS["later"][1], -0.005, 0.096),
                             (CALLS["third"][1], -0.008, 0.087), (CALLS["fifth"][1], -0.011, 0.092)):
        plans = [p for p in EdgeRun.load(edges / "edges.json").plans if p.counts.copies]
        found = {p.name: p.measured_seconds / p.predicted_seconds - 1 for p in plans}
        assert len(found) == 12 and low < min(found.values()) and max(found.values()) < high
        assert max(found, key=found.get) == "cut 5"


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f not in (FOURTH / "hf-qwen2moe-prefill.same", FIFTH_MAMBA)],
                         ids=row_id)
def test_every_row_passed_its_gates_and_is_within_its_predictions(folder):
    row = place_table.row_of(folder)
    assert row.predictions_within == row.predictions >= 6
    assert row.gates == "identical"


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f not in (*PREFILLS, FIFTH_PREFILL)], ids=row_id)
def test_the_other_rows_choose_within_3_percent_of_the_best(folder):
    assert place_table.row_of(folder).chosen_over_best <= 1 + place_table.CHOSEN_WITHIN


def test_qwen2moe_prefill_misses_the_choice_target_on_the_h100():
    """The model chose single:a with free slots: predicted 662.9 µs for the 2 slots (profile's free
    graph on a), measured 739.6 (+11.6 %). Request distribution was predicted 749.4 µs (b's graph
    alone, 628.7 µs, stretched by its shared factor, 1.212, measured with a looping its graph) and ran
    695.9 (-7.1 %; 695.6 with free slots, the best): 1.107x b alone. Either error alone keeps the choice."""
    row, found = place_table.row_of(PREFILL), strategies(PREFILL)
    assert (row.best, row.chosen) == ("replicas, slots free", "single:a, slots free")
    assert 1.06 < row.chosen_over_best < 1.07 and row.chosen_over_best > 1 + place_table.CHOSEN_WITHIN
    replicas, chosen = found["replicas"], found[row.chosen]
    assert -0.072 < off(replicas) < -0.071 and 0.115 < off(chosen) < 0.116
    costs = CostTable.from_json((PREFILL / "costs.json").read_text(), str(PREFILL / "costs.json"))
    shared = {device: round(factor, 3) for device, factor in costs.shared_factors().items()}
    assert shared == {"a": 1.234, "b": 1.212}
    assert round(replicas["seconds"] / costs.graph_seconds["b"], 3) == 1.107  # one slot a device, run at once
    # with request distribution predicted as it ran, the model still ranks single:a with free slots first;
    # with single:a's free slots predicted as they ran, it still ranks them above request distribution
    assert chosen["predicted_seconds"] < replicas["seconds"] and chosen["seconds"] < replicas["predicted_seconds"]


def test_qwen2moe_prefill_misses_it_again_in_the_third_call_by_the_same_two_errors():
    """Again single:a with free slots chosen, predicted 666.5 µs for the 2 slots and run in 723.0
    (+8.5 %), over request distribution, predicted 756.4 and run in 686.2 (-9.3 %): 1.054x the best.
    The free-slot speedup profile measured on a (its graph alone over its free graph, 1.705) is above
    what bench disagg's single:a rows ran in the same call (1.581), as it was in the later call (1.72
    and 1.56): the two time the same graph shape (one chain per replica), so the gap is not noise."""
    folder = PREFILLS[1]
    row, found = place_table.row_of(folder), strategies(folder)
    assert (row.best, row.chosen) == ("replicas", "single:a, slots free")
    assert 1.05 < row.chosen_over_best < 1.06
    assert 0.084 < off(found[row.chosen]) < 0.085 and -0.094 < off(found["replicas"]) < -0.092
    costs = CostTable.from_json((folder / "costs.json").read_text(), str(folder / "costs.json"))
    assert round(costs.graph_seconds["a"] / costs.graph_seconds_free["a"], 3) == 1.705
    assert round(found["single:a"]["seconds"] / found[row.chosen]["seconds"], 3) == 1.581
    chosen, replicas = found[row.chosen], found["replicas"]
    assert chosen["predicted_seconds"] < replicas["seconds"] and chosen["seconds"] < replicas["predicted_seconds"]


def test_a_latency_plan_on_one_device_is_read_as_that_devices_own_run():
    """Every row's latency plan but the fifth call's Mamba (below) places every launch on a: the table
    reads single:a's own run (the same graph, timed twice, differs by noise), so Qwen2-MoE, where a was the
    faster device alone, meets the target exactly, and Mamba, where b was (by 0.16 % in the first call,
    1.0 % in the later one, 0.9 % in the third, against the profile's ranking every time), misses it by
    that much."""
    for folder in FOLDERS:
        assert place_table.timed_as(folder, "latency-greedy") == ("latency-greedy" if folder == FIFTH_MAMBA
                                                                 else "single:a"), folder
    for folder in (PAIRS / "hf-qwen2moe-decode.same", PREFILL):
        assert place_table.row_of(folder).latency_over_single == 1.0
    for folder, low in ((PAIRS, 1.001), (LATER, 1.009), (THIRD, 1.008)):
        mamba = strategies(folder / "hf-mamba-decode.same")
        ratio = mamba["single:a"]["seconds"] / mamba["single:b"]["seconds"]
        assert low < ratio < 1.011 and place_table.row_of(folder / "hf-mamba-decode.same").latency_over_single == ratio


@pytest.mark.parametrize("pairs", [PAIRS, LATER], ids=list(CALLS)[:2])
def test_mamba_decodes_pipeline_is_within_its_prediction_on_the_h100(pairs):
    """6 copies a slot both times, not the H200's 21 (most of them the tail of copies home)."""
    found = strategies(pairs / "hf-mamba-decode.same")
    assert found["pipeline"]["copies"] == 12 and found["pipeline, 1 slot"]["copies"] == 6
    assert abs(off(found["pipeline"])) < 0.03 and abs(off(found["pipeline, 1 slot"])) < 0.03


def test_mamba_decodes_pipeline_with_more_copies_runs_faster_than_today_model_says_and_as_the_link_says():
    """The third call's profile cut Mamba's pipeline with 16 copies a slot, not 6: chained over two
    slots it ran 7.9 % faster than today's model (4 µs + bytes at 25 GB/s a copy) predicted, as the
    H200's cut with 21 ran 15.6 % faster; predicted again with the link measured in the same call
    (about 0.6-1.2 µs a copy), it is within 2.3 %. The cuts with 6 copies move by less than 0.3 %."""
    folder = THIRD / "hf-mamba-decode.same"
    found, links = strategies(folder), LinkTable.load(CALLS["third"][2] / "links.json")
    again = place_table.repredicted(folder, links)
    assert found["pipeline"]["copies"] == 32 and found["pipeline, 1 slot"]["copies"] == 16
    assert -0.080 < off(found["pipeline"]) < -0.078 and -0.094 < off(found["pipeline, slots scheduled"]) < -0.092
    assert 0.022 < off(again["pipeline"]) < 0.024 and abs(off(again["pipeline, slots scheduled"])) < 0.01
    for pairs, link in ((PAIRS, "h100-link"), (LATER, "h100-link-2")):
        earlier = pairs / "hf-mamba-decode.same"
        moved = place_table.repredicted(earlier, LinkTable.load(DATA / link / "links.json"))["pipeline"]
        assert abs(moved["predicted_seconds"] / strategies(earlier)["pipeline"]["predicted_seconds"] - 1) < 0.003


def test_with_each_devices_slots_captured_together_qwen2moe_prefill_chooses_within_the_target():
    """The fourth call: ``runtime.gate.Gate`` captures every slot of a, then every slot of b (before, slot
    by slot, a's and b's captures interleaved in memory). a's free slots then ran as profile predicted
    (335.1 µs a slot against 335.5), the choice is 1.001x the best, and request distribution (343.2
    against 384.3, -10.7 %) is the row's one prediction outside 10 %: profile's shared factors (1.19 and
    1.25 here, each device timed while the other loops its own graph) overstate what the two slots of
    one graph met (1.09x b alone; 1.09 to 1.12 on the six rows of the last three calls)."""
    assert (FOURTH / "smi.txt").read_text().splitlines()[1].startswith("NVIDIA H100 80GB HBM3")
    folder = FOURTH / "hf-qwen2moe-prefill.same"
    row, found = place_table.row_of(folder), strategies(folder)
    assert row.chosen == "single:a, slots free" and row.chosen_over_best < 1.002
    assert abs(off(found[row.chosen])) < 0.002
    assert (row.predictions_within, row.predictions, row.worst_prediction) == (6, 7, "replicas")
    assert -0.108 < off(found["replicas"]) < -0.106
    for pairs in (LATER, THIRD, FOURTH):
        for target in ("hf-qwen2moe-prefill.same", "hf-mamba-decode.same"):
            costs = CostTable.from_json((pairs / target / "costs.json").read_text(), target)
            together = strategies(pairs / target)["replicas"]["seconds"] / max(costs.graph_seconds.values())
            assert 1.08 < together < 1.12 < min(costs.shared_factors().values())


def test_profiles_together_graph_scales_the_shared_factors_so_the_model_predicts_request_distribution():
    """``graph_seconds_together`` is request distribution's own graph (one copy a device, launched
    together); given it, ``CostTable.contention_factors`` scales the looping factors so that the
    model predicts it. Here the graph ``bench disagg`` measured stands in for profile's (which this
    run predates): the model then predicts request distribution within 0.5 %, not 10.7 % over, and
    keeps the choice; with b's factor 1.10 instead of 1.25, a's 1.08 instead of 1.19."""
    from dataclasses import replace

    from bench import place_calibration
    from kernelfleet.plan.contention import Contention

    folder = FOURTH / "hf-qwen2moe-prefill.same"
    found = strategies(folder)
    costs = place_calibration.profiled(folder)
    table = place_calibration.corrected(costs, costs.graph_seconds, "contention")
    assert table.contention_factors() == table.shared_factors()  # nothing measured together: as before
    together = replace(table, graph_seconds_together=found["replicas"]["seconds"])
    factors = together.contention_factors()
    assert round(factors["a"], 2) == 1.08 and round(factors["b"], 2) == 1.10
    timed = place_calibration.slot_strategies(folder, together)
    predicted = place_calibration.predictions(folder, together, Contention.of(together), timed)
    assert abs(found["replicas"]["seconds"] / predicted["replicas"] - 1) < 0.005
    again = {n: {**r, "predicted_seconds": predicted.get(n, r.get("predicted_seconds"))} for n, r in found.items()}
    row = place_table.row_of(folder, again)
    assert row.chosen == "single:a, slots free" and row.predictions_within == row.predictions == 7


def test_profiles_together_graph_on_the_gpu_predicts_request_distribution():
    """The fifth call, profile timing the pair's graphs launched together: request distribution ran
    within 0.1 % (Qwen2-MoE prefill) and 0.9 % (Mamba) of its prediction, where every row of the four
    calls before it ran 4.3-10.7 % faster than predicted. Launched together, the graphs took 1.10-1.11x
    the slower alone, as the two slots of request distribution's graph had (1.08-1.12, above); the
    looping factors (1.18-1.27) are scaled to 1.10-1.15. Mamba now chooses the best exactly and Qwen2-MoE
    prefill predicts all 7 strategies within 10 % (its choice, below)."""
    assert (FIFTH / "smi.txt").read_text().splitlines()[1].startswith("NVIDIA H100 80GB HBM3")
    for folder, within in ((FIFTH_PREFILL, 0.001), (FIFTH_MAMBA, 0.009)):
        costs = CostTable.from_json((folder / "costs.json").read_text(), str(folder / "costs.json"))
        assert costs.graph_seconds_together is not None
        assert 1.10 < costs.graph_seconds_together / max(costs.graph_seconds[d] for d in "ab") < 1.11
        factors, looping = costs.contention_factors(), costs.shared_factors()
        assert all(1.10 < factors[d] < 1.15 and 1.18 < looping[d] < 1.28 for d in "ab")
        assert abs(off(strategies(folder)["replicas"])) < within
    before = [off(strategies(f)["replicas"]) for f in FOLDERS if f.parent != FIFTH]
    assert len(before) == 8 and -0.108 < min(before) and max(before) < -0.042
    assert place_table.row_of(FIFTH_MAMBA).chosen_over_best == 1.0
    assert place_table.row_of(FIFTH_PREFILL).predictions_within == place_table.row_of(FIFTH_PREFILL).predictions == 7


def test_qwen2moe_prefill_misses_the_choice_in_the_fifth_call_on_a_near_tie_and_profiles_free_graph():
    """Request distribution predicted 344.7 µs a slot, one device a with free slots 346.6: 0.55 % apart,
    so the model chose request distribution, which ran 344.8; a's free slots ran 332.2 (the planner's
    throughput plan, the same graph) and 334.4, 1.038x faster. Profile timed a's free graph at 346.6 µs
    a slot, 3.4 % over its 331.4-335.5 in the three calls before; bench disagg's ran as those."""
    row, found = place_table.row_of(FIFTH_PREFILL), strategies(FIFTH_PREFILL)
    assert (row.chosen, row.best) == ("replicas", "throughput-milp, slots free")
    assert 1.037 < row.chosen_over_best < 1.039
    free = found["single:a, slots free"]["predicted_seconds"] / found["replicas"]["predicted_seconds"]
    assert 1.005 < free < 1.006
    before = [CostTable.from_json((pairs / "hf-qwen2moe-prefill.same" / "costs.json").read_text(), "before")
              .graph_seconds_free["a"] for pairs in (LATER, THIRD, FOURTH)]
    now = CostTable.from_json((FIFTH_PREFILL / "costs.json").read_text(), "now").graph_seconds_free["a"]
    assert 0.033 < now / max(before) - 1 < 0.034 and max(before) / min(before) < 1.013


def test_mambas_latency_plan_split_across_the_devices_beats_both_alone_and_runs_slower_than_predicted():
    """The fifth call's latency plan for Mamba decode puts launches on both devices, 25 copies a slot:
    it ran 0.96x the fastest single device (the latency target, met where the all-on-a plans of earlier
    calls missed by noise), but 11.9 % slower than predicted (10.0 % with the looping shared factors):
    the model overstates what the two partitions gain from running one request's branches at once."""
    row, found = place_table.row_of(FIFTH_MAMBA), strategies(FIFTH_MAMBA)
    latency = found["latency-greedy"]
    assert latency["copies"] == 50 and latency["slots"] == 2
    assert 0.95 < row.latency_over_single < 0.97 and row.worst_prediction == "latency-greedy"
    assert 0.118 < off(latency) < 0.120 and (row.predictions_within, row.predictions) == (5, 6)
