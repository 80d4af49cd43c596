"""The placement benchmark's table (bench/place_table.py) on the run recorded on one H200
(tests/data/h200-place-pairs, written by `python -m bench.place_pairs`; the two checks of each row
run on the H100's table too, tests/data/h100-place-table): the figures follow from
the recorded strategies, and today's latency policy, re-run on each recorded program and cost
table, picks a placement the run timed and predicts it no slower than the fastest single device."""

import gzip
import json

import pytest

from bench import place_calibration, place_table
from kernelfleet.costs.table import CostTable
from kernelfleet.plan import command, links
from kernelfleet.plan.slots import SUFFIXES, per_request

pytestmark = pytest.mark.replay

FOLDERS = sorted(p.parent for p in place_table.RECORDED.glob("*/disagg.json"))
# the three rows the recorded choice missed, run again on the H200 after the model's copy-queue fix
CHECK = sorted(p.parent for p in (place_table.RECORDED.parent / "h200-place-pairs-check").glob("*/disagg.json"))
# the whole table made again on one H100 (tests/replay/test_place_table_h100.py)
H100 = sorted(p.parent for p in (place_table.RECORDED.parent / "h100-place-table").glob("*/disagg.json"))


def test_the_recorded_run_covers_the_reference_and_transformers_steps_on_both_pairs():
    names = {f.name for f in FOLDERS}
    assert {f"{t}.different" for t in ("llama-decode", "moe-decode", "mamba-decode", "vlm-prefill", "dit-denoise",
                                       "hf-llama-decode", "hf-qwen2moe-decode", "hf-qwen2moe-prefill")} <= names
    assert len(names) == 22 and {n.replace(".different", ".same") for n in names} <= names  # both pairs, every target
    for folder in FOLDERS:  # the different-kernel pair places units; the same-kernel pair launches
        with gzip.open(folder / "program.json.gz", "rt") as f:
            units = json.load(f).get("units", False)
        kernels = json.loads((folder / "disagg.json").read_text())["devices"]["b"]["kernels"]
        assert units == (kernels != "default") or "mamba" in folder.name, folder.name


@pytest.mark.parametrize("folder", FOLDERS + CHECK + H100, ids=[f.name for f in FOLDERS]
                         + [f"check-{f.name}" for f in CHECK] + [f"h100-{f.name}" for f in H100])
def test_each_row_follows_from_its_recorded_strategies(folder):
    row = place_table.row_of(folder)
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    rates = {n: r["slots_per_second"] for n, r in found.items() if r.get("seconds") and not n.startswith(("link ", "ablation"))
             and not n.endswith("1 slot")}
    assert max(rates, key=rates.get) == row.best
    predicted = {p: found[p]["predicted_seconds"] for p in place_table.PLANS if found.get(p, {}).get("seconds")}
    # chosen among every plan in every slot mode, as kernelfleet plan ranks them
    modes = {f"{p}{suffix}": found[f"{p}{suffix}"]["predicted_seconds"] / found[f"{p}{suffix}"]["slots"]
             for p in place_table.PLANS for suffix in SUFFIXES.values()
             if found.get(f"{p}{suffix}", {}).get("seconds") and found[f"{p}{suffix}"].get("predicted_seconds")}
    assert min(modes, key=modes.get) == row.chosen and row.chosen_over_best >= 1.0
    assert len(modes) > len(predicted)  # free and scheduled rows were ranked too
    within = sum(abs(found[p]["seconds"] / predicted[p] - 1) <= 0.10 for p in predicted)
    assert (row.predictions_within, row.predictions) == (within, len(predicted))
    assert all(r["gate"].split(":")[0] in row.gates for n, r in found.items() if n in rates)


@pytest.mark.parametrize("folder", FOLDERS + H100, ids=[f.name for f in FOLDERS] + [f"h100-{f.name}" for f in H100])
def test_todays_latency_plan_is_predicted_no_slower_than_the_fastest_single_device(folder):
    problem = command.setup(folder / "program.json.gz", folder / "costs.json", ["a", "b"], [], links.LINK_GBPS,
                            [], [], None, links.COPY_US).problem
    chosen, plans = command.make_plans(problem, "latency", 10.0)
    singles = [per_request(problem, p, 1) for p in plans if p.policy.startswith("single:")]
    assert per_request(problem, chosen, 1) <= min(singles) * (1 + 1e-9)
    assert place_table.replanned_latency(folder) != "-"  # a placement the run timed


def test_the_table_prints_every_row_and_its_verdicts(capsys):
    assert place_table.main([str(place_table.RECORDED)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(out[-1])
    assert len(figures["rows"]) == len(FOLDERS) and len(figures["verdicts"]) == 4
    # the latency policy (a placement must be predicted 5 % faster than one device) re-run on each table
    assert figures["verdicts"]["today's latency plan at or below the fastest single device"] == "met on every row"
    assert sum(line.startswith("| ") for line in out) == len(FOLDERS) + 1  # the head and a line a row


@pytest.fixture(scope="module")
def calibrations():
    return {f.name: place_calibration.evaluate(f) for f in FOLDERS}


# the run placed launches where both captures were identical, while the folder keeps the profile's
# unit program, whose accesses differ slightly: recomputed, their pipelines differ by up to 6 %
RECOMPUTED_APART = {("mamba-decode.different", "pipeline"), ("hf-mamba-decode.different", "pipeline"),
                    ("hf-qwen2moe-prefill.same", "pipeline")}


def test_recomputed_predictions_are_the_runs_own_but_for_three_pipelines():
    """The run predicted with ``contention.predict`` over its own measured graph times; recomputed
    on the CPU the same way from the tables as the run had them (before profile steadied timing
    outliers), every chained row's prediction is the run's to the last digit."""
    for folder in FOLDERS:
        found = json.loads((folder / "disagg.json").read_text())["strategies"]
        raw = CostTable.from_json((folder / "costs.json").read_text(), str(folder / "costs.json"))
        for name, error in place_calibration.evaluate(folder, raw).errors["contention"].items():
            recorded = found[name]["seconds"] / found[name]["predicted_seconds"] - 1
            if (folder.name, name) in RECOMPUTED_APART:
                assert abs(error - recorded) < 0.06, (folder.name, name)
            else:
                assert error == pytest.approx(recorded, abs=1e-9), (folder.name, name)


def test_the_shared_and_free_graph_times_bring_most_predictions_within_ten_percent(calibrations):
    found = list(calibrations.values())
    totals = place_calibration.totals(found)
    # of the run's 147 chained rows and 152 free and scheduled ones, Qwen2-MoE decode's throughput and
    # latency plans (same-kernel pair) split aten.sort, which passes data through its own index
    # workspace: today's validator refuses them (graph.deps.together), so they are not predicted.
    # The tables are as profile makes them today: timing outliers steadied (vlm-prefill's same-kernel
    # table had 25; with them, 138 of 145 contention rows and 139 of 150 free ones were within 10 %)
    assert totals["recorded predictions"] == "138 of 145 chained rows"
    assert totals["none"] == "73 of 145 chained rows, 50 of 101 mixed"
    assert totals["scale"] == "128 of 145 chained rows, 84 of 101 mixed"
    assert totals["contention"] == "141 of 145 chained rows, 97 of 101 mixed"  # what bench disagg and plan predict
    assert totals["free and scheduled rows within 10 %, contention"] == "141 of 150"
    for e in found:
        # profile's own graph times of each single device: bench disagg timed the same graphs within 5 %
        assert all(abs(e.errors["scale"][s]) < 0.05 for s in place_calibration.SINGLES), e.target
        # two disjoint partitions of one H200 busy at once still run slower than each alone (memory,
        # L2): each graph alone predicts request distribution 5-15 % too fast, its shared factor within 12 %
        assert 0.05 < e.errors["scale"]["replicas"] < 0.15, e.target
        assert abs(e.errors["contention"]["replicas"]) < 0.12, e.target


def test_the_calibrated_table_prints_a_row_per_folder_and_the_totals(capsys):
    assert place_table.main([str(place_table.RECORDED), "--calibrated"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    totals = json.loads(out[-1])["totals"]
    assert {"recorded predictions", *place_calibration.CORRECTIONS} <= set(totals)
    # recomputed with today's model (free slots' copies queue on their link), the choice holds on every row
    assert totals["chosen within 3 % of the best, recorded"] == "19 of 22 rows"
    assert totals["chosen within 3 % of the best, contention"] == "22 of 22 rows"
    assert sum(line.startswith("| ") for line in out) == 2 * (len(FOLDERS) + 1)  # predictions, then choices


def test_the_check_run_chose_as_the_recomputation_did():
    """What the fixed model picked on the H200 for the rows the recording's choice missed is what
    the CPU recomputation of the recording picks (a single device, slots free), within 3.0 % of the
    fastest measured row (single:a and single:b tie there within run-to-run noise)."""
    assert [f.name for f in CHECK] == ["dit-denoise.same", "hf-qwen2moe-decode.same", "vlm-prefill.same"]
    for folder in CHECK:
        row = place_table.row_of(folder)
        assert row.chosen == "single:a, slots free" and row.chosen_over_best < 1.0305, folder.name
