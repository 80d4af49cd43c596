"""The cost table scaled to each device's measured whole-step graph (``CostTable.calibrated``), on
the H200 run recorded in tests/data/h200-place-pairs: the single-device graph times of each
``disagg.json`` are written into its cost table as ``graph_seconds`` (what ``kernelfleet profile``
measures with ``profile/steptime.py``), then ``kernelfleet plan`` plans from it, says so, and
predicts each single device's graph as measured; per-device profiles merge their graph times."""

import json
import re
import sys

import pytest
from typer.testing import CliRunner

from bench import place_calibration, place_table
from kernelfleet.cli import app, main
from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan import command, links
from kernelfleet.plan.slots import per_request

pytestmark = pytest.mark.replay

FOLDERS = sorted(p.parent for p in place_table.RECORDED.glob("*/disagg.json"))
PAIR = place_table.ROOT / "tests" / "data" / "h200-kernel-pair" / "llama-decode"


def measured_table(folder, tmp_path):
    """The folder's cost table with its run's single-device graph times, as profile now writes it."""
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    costs = CostTable.from_json((folder / "costs.json").read_text())
    path = tmp_path / "costs.json"
    path.write_text(place_calibration.with_graph(costs, place_calibration.graph_seconds(found)).to_json())
    return path, found


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_the_planner_predicts_each_single_device_as_its_graph_measured(folder, tmp_path):
    path, found = measured_table(folder, tmp_path)
    setup = command.setup(folder / "program.json.gz", path, ["a", "b"], [], links.LINK_GBPS, [], [],
                          None, links.COPY_US)
    assert re.search(r"scaled to the measured graph time \(a x\d\.\d{3}, b x\d\.\d{3}\)", setup.notes[0])
    _, plans = command.make_plans(setup.problem, "single", 10.0)
    singles = [p for p in plans if p.policy.startswith("single:")]
    assert len(singles) == 2
    for plan in singles:
        measured = found[plan.policy]["seconds"] / found[plan.policy]["slots"]
        assert per_request(setup.problem, plan, 1) == pytest.approx(measured, rel=1e-9), plan.policy


def test_plan_prints_what_it_scaled_and_an_old_table_plans_as_before(tmp_path):
    folder = place_table.RECORDED / "llama-decode.same"
    path, _ = measured_table(folder, tmp_path)
    result = CliRunner().invoke(app, ["plan", str(folder / "program.json.gz"), str(path), "--policy", "single"])
    assert result.exit_code == 0, result.output
    said = re.search(r"scaled to the measured graph time \(a x(\d\.\d{3}), b x(\d\.\d{3})\)",
                     " ".join(result.output.split()))
    costs = CostTable.from_json(path.read_text())
    assert said and [float(x) for x in said.groups()] == [round(costs.graph_factors()[d], 3) for d in "ab"]
    # a table written before profile measured graphs loads and plans as it did, unscaled
    recorded = json.loads((folder / "costs.json").read_text())
    old_path = tmp_path / "old-costs.json"
    old_path.write_text(json.dumps({k: v for k, v in recorded.items() if not k.startswith("graph_seconds")}))
    old = command.load_costs(old_path)
    assert old.graph_seconds is None and old.graph_seconds_free is None
    result = CliRunner().invoke(app, ["plan", str(folder / "program.json.gz"), str(old_path), "--policy", "single"])
    assert result.exit_code == 0 and "scaled to" not in result.output, result.output


@pytest.mark.parametrize("graph, said", [({"a": -1.0}, "graph_seconds.a"), ({"z": 1e-4}, "device 'z'"),
                                         ({"a": "fast"}, "graph_seconds.a")])
def test_a_bad_graph_time_is_one_line(graph, said, tmp_path, monkeypatch, capsys):
    folder = place_table.RECORDED / "llama-decode.same"
    doc = json.loads((folder / "costs.json").read_text())
    (tmp_path / "costs.json").write_text(json.dumps({**doc, "graph_seconds": graph}))
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "plan", str(folder / "program.json.gz"),
                                      str(tmp_path / "costs.json")])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and said in err, err


def test_profiles_merged_into_units_keep_each_devices_graph_time(tmp_path):
    from kernelfleet.analyze import merge_profiles
    from kernelfleet.profile.table import StepTimes, cost_table

    graphs = {"a": 200e-6, "b": 240e-6}  # what steptime measured on each device
    shared, free = {"a": 230e-6, "b": 250e-6}, {"a": 120e-6}  # b's free copies left unmeasured
    for device, graph in graphs.items():
        raw = RawCapture.load(PAIR / f"profile.capture.{device}.json.gz")
        program = assemble(raw)
        table = cost_table(raw, program, {device: [1e-6] * len(program.launches)}, device,
                           StepTimes({device: graph}, {d: t for d, t in free.items() if d == device},
                                     {device: shared[device]}))
        (tmp_path / f"launches.{device}.json").write_text(table.to_json())
        (tmp_path / f"capture.{device}.json.gz").write_bytes((PAIR / f"profile.capture.{device}.json.gz").read_bytes())
    said = merge_profiles([tmp_path], tmp_path / "merged")
    assert "whole-step graph: a 0.200 ms" in said
    merged = CostTable.from_json((tmp_path / "merged" / "costs.json").read_text())
    assert merged.graph_seconds == graphs
    assert merged.graph_seconds_shared == shared and merged.graph_seconds_free == free
    assert "x1.15 with the others running; free copies x1.67 the work per second), b 0.240 ms" in said
    calibrated = merged.calibrated()
    for device, graph in graphs.items():  # every launch is in one unit: the unit column scales to the graph
        assert sum(row[device] for row in calibrated.seconds) == pytest.approx(graph)
    assert merged.graph_seconds_together is None  # the launch tables keep one device each: no pair
    # the run that timed both (profile_per_device) passes the pair's graphs launched together: request
    # distribution's own graph, which scales the looping shared factors (1.15 and 1.04) to what it met
    said = merge_profiles([tmp_path], tmp_path / "together", together=246e-6)
    assert "together once 0.246 ms, so the predictions share by a x1.11, b x1.03" in said
    paired = CostTable.from_json((tmp_path / "together" / "costs.json").read_text())
    assert paired.graph_seconds_together == 246e-6 and paired.graph_seconds == graphs


def test_steadied_takes_only_timing_outliers_of_a_kernels_repeats_as_their_median():
    from kernelfleet.profile.table import steadied

    kernels = ["gemm"] * 4 + ["norm"] * 3 + ["rare"] * 2 + ["moe"] * 3
    seconds = [10e-6, 11e-6, 30e-6, 10.5e-6,  # one outlier: 30 > 2 x 10.75
               2e-6, 2e-6, None,  # a launch no time was given: its group is left alone
               1e-6, 9e-6,  # a group of two: no median to trust
               5e-6, 9e-6, 7e-6]  # real spread (an MoE's routing): within 2x, kept
    out, replaced = steadied(seconds, kernels)
    assert replaced == 1 and out == [10e-6, 11e-6, 10.75e-6, 10.5e-6, *seconds[4:]]


def test_the_recorded_vlm_table_was_the_noisy_one_and_its_re_run_was_not():
    """vlm-prefill's same-kernel table, the one whose plans missed their predictions, held 25 timing
    outliers (1.5-µs elementwise kernels timed at 8-12 µs); the check run profiled the same step
    again and found 2, and the other tables 0-2. profile steadies them since (place_calibration.profiled)."""
    from kernelfleet.kernels.ir import Program
    from kernelfleet.profile.table import kernel_shapes, steadied

    def outliers(folder):
        program = Program.load(folder / "program.json.gz")
        costs = CostTable.from_json((folder / "costs.json").read_text(), "costs")
        kernels = kernel_shapes(program)
        return sum(steadied([row.get(d) for row in costs.seconds], kernels)[1] for d in ("a", "b", "whole"))

    same = {f.name: outliers(f) for f in FOLDERS if f.name.endswith(".same")}
    assert same["vlm-prefill.same"] == 25 and max(n for name, n in same.items() if name != "vlm-prefill.same") <= 2
    assert outliers(place_table.ROOT / "tests" / "data" / "h200-place-pairs-check" / "vlm-prefill.same") == 2
