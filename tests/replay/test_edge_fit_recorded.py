"""The per-edge fit on the CPU (``python -m bench.place_table --edges``), on a fixture *derived*
from the recorded H200 run (tests/data/edges-derived: the one-slot and conservative-ablation rows
of its same-kernel folders, which the chained rows leave out; ``python -m bench.edge_cost
--derive`` rebuilds it), not on an edge experiment: the fit is printed and said to be derived, the
22 recorded rows are re-predicted with it beside today's model, a fit charging nothing changes no
prediction, one charging copies raises exactly the rows that copy, and a bad file is one line; and
``kernelfleet plan --edge-fit`` charges a fit in its predictions."""

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from recorded import assert_same_fit

from bench import edge_cost, place_table
from kernelfleet.costs.links import LinkTable
from kernelfleet.plan import command
from kernelfleet.plan.edgerun import EdgeRun
from kernelfleet.plan.edges import EdgeFit, Term
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.model import Plan
from kernelfleet.plan.slots import per_request_modes

pytestmark = pytest.mark.replay

DERIVED = place_table.ROOT / "tests" / "data" / "edges-derived" / "edges.derived.json"
FOLDERS = sorted(p.parent for p in place_table.RECORDED.glob("*/disagg.json"))
MISSED = [f for f in FOLDERS if f.name in ("dit-denoise.same", "hf-qwen2moe-decode.same")]


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    out = tmp_path_factory.mktemp("fit") / "fit.json"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert place_table.main(["--edges", str(DERIVED), "--fit-out", str(out)]) == 0
    return text.getvalue(), out


def test_the_committed_fixture_is_what_derive_makes_of_the_recorded_run():
    committed = EdgeRun.load(DERIVED)
    again = edge_cost.derived(sorted(p.parent for p in place_table.RECORDED.glob("*.same/disagg.json")),
                              LinkTable.load(edge_cost.LINK))
    # 44 one-slot and ablation rows, less Qwen2-MoE decode's three of the plans today's validator refuses
    assert committed.derived and committed.plans == again.plans and len(committed.plans) == 41


def test_the_fit_is_printed_said_to_be_derived_and_the_rows_re_predicted_beside_todays_model(printed):
    text, out = printed
    lines = text.splitlines()
    assert lines[0].startswith("edge fit: ") and "per copy on the critical chain" in lines[0]
    assert any(line.startswith("WARNING: ") and "derived from recorded rows" in line for line in lines)
    found = json.loads(lines[-1])
    assert len(found["rows"]) == 22 and [t["name"] for t in found["fit"]["terms"]] == [
        "critical_copies", "waits", "forks"]
    assert found["without_fit"]["chained plans within 10 % of prediction"] == "141 of 145 rows"
    assert found["verdicts"]["chained plans within 10 % of prediction"] == "143 of 145 rows"
    assert found["verdicts"]["chosen within 3 % of the best"] == "met on every row"
    assert EdgeFit.load(out).plans == found["fit"]["plans"] == 41 - sum(  # the zero-byte control: none derived
        p.measured_seconds is None for p in EdgeRun.load(DERIVED).plans)
    # --fit-out of the same, kept
    assert_same_fit(EdgeFit.load(DERIVED.with_name("fit.derived.json")), EdgeFit.load(out))


@pytest.mark.parametrize("folder", MISSED, ids=[f.name for f in MISSED])
def test_a_fit_charging_nothing_changes_nothing_and_one_charging_copies_raises_the_rows_that_copy(folder: Path):
    today = place_table.repredicted(folder)
    nothing = place_table.repredicted(folder, fitted=EdgeFit([Term("copies", 0.0)], 1, 0.0, 0.0))
    assert {n: r.get("predicted_seconds") for n, r in nothing.items()} == \
        {n: r.get("predicted_seconds") for n, r in today.items()}
    charged = place_table.repredicted(folder, fitted=EdgeFit([Term("copies", 1e-6)], 1, 0.0, 0.0))
    for name, row in charged.items():
        if (not today[name].get("seconds") or name.startswith(("link ", "ablation")) or name.endswith("1 slot")
                or "refused" in today[name]):
            continue  # re-predicted are the rows in a slot mode of plans today's validator passes
        if today[name].get("copies"):
            assert row["predicted_seconds"] > today[name]["predicted_seconds"], name
        else:
            assert row["predicted_seconds"] == today[name]["predicted_seconds"], name


def test_a_bad_edge_file_and_an_impossible_fit_are_one_line(tmp_path: Path, capsys):
    (tmp_path / "bad.json").write_text('{"kernelfleet_edge_run": 1, "plans": 3, "source": "x"}')
    assert place_table.main(["--edges", str(tmp_path / "bad.json")]) == 2
    empty = EdgeRun([], "nothing timed")
    empty.save(tmp_path / "empty.json")
    assert place_table.main(["--edges", str(tmp_path / "empty.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "bad.json: not a run of the edge experiment: plans" in err[0] and "0 plans cannot fit 3" in err[1]


def test_kernelfleet_plan_charges_an_edge_fit_only_where_given(tmp_path: Path):
    folder = place_table.RECORDED / "dit-denoise.same"
    EdgeFit([Term("copies", 1e-6)], 1, 0.0, 0.0, "synthetic, not measured").save(tmp_path / "fit.json")
    given = (folder / "program.json.gz", folder / "costs.json", ["a", "b"], [], LINK_GBPS, [], [], None, COPY_US)
    plain, charged = command.setup(*given), command.setup(*given, edge_fit_path=tmp_path / "fit.json")
    assert [n for n in charged.notes if n.startswith("edges: ")] == [
        ("edges: every prediction in a slot mode charges +1.000 µs per copy (least squares over 1 plans, rms residual "
        "0.00 -> 0.00 µs), fitted on synthetic, not measured (the MILP's objective does not)")]
    for name, copies in (("throughput-milp", 32), ("single-a", 0)):
        plan = Plan.from_json((folder / f"plan.{name}.json").read_text(), name)
        before, after = per_request_modes(plain.problem, plan, 2), per_request_modes(charged.problem, plan, 2)
        # two requests a graph: each pays its own copies, the fit's µs a copy
        assert {m: after[m] - before[m] for m in before} == pytest.approx(dict.fromkeys(before, copies / 2 * 1e-6))


def test_kernelfleet_plan_with_a_bad_edge_fit_is_one_line(tmp_path: Path):
    folder = place_table.RECORDED / "dit-denoise.same"
    (tmp_path / "fit.json").write_text('{"kernelfleet_edges": 1, "terms": [], "plans": 0}')
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(folder / "program.json.gz"),
                           str(folder / "costs.json"), "--edge-fit", str(tmp_path / "fit.json")],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [(f"kernelfleet: error: {tmp_path / 'fit.json'}: not a per-edge fit: plans: "
                                                "Input should be greater than or equal to 1, got 0 (2 more errors)")]


def test_with_the_link_the_experiment_used_the_fit_corrects_that_links_predictions(tmp_path: Path, capsys):
    run = EdgeRun.load(DERIVED)
    linked = place_table.edge_fit(run, DERIVED, ("critical_copies",), with_link=True)
    timed = [p for p in run.plans if p.measured_seconds is not None]
    x = [p.counts.critical_copies for p in timed]
    y = [p.measured_seconds - p.predicted_link_seconds for p in timed]
    assert linked.terms[0].seconds == pytest.approx(sum(a * b for a, b in zip(x, y)) / sum(a * a for a in x))
    other = LinkTable(LinkTable.load(edge_cost.LINK).links, "another measurement")
    other.save(tmp_path / "links.json")
    assert place_table.main(["--edges", str(DERIVED), "--link", str(tmp_path / "links.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "give the link the experiment used" in err[0]
