"""The contention model (plan/contention.py) on the H200 run recorded in tests/data/h200-place-pairs,
its cost tables given synthetic shared and free graph times (the run was profiled before profile
measured them; these figures are not measurements, they only make the model's effect visible):
each device alone still predicts as its graph measured, strategies that keep both devices busy are
predicted slower by up to the shared factor, and free slots predicted fastest are what the
placement table and ``kernelfleet plan --in-flight`` choose."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from bench import place_calibration, place_table
from kernelfleet.bench.choice import chosen
from kernelfleet.cli import app
from kernelfleet.costs.table import CostTable
from kernelfleet.plan.contention import Contention

pytestmark = pytest.mark.replay

SHARED, FREE = 1.15, 1.8
FOLDERS = [place_table.RECORDED / name for name in ("llama-decode.same", "moe-decode.different")]


def table_with(folder, shared=None, free=None) -> tuple[CostTable, dict]:
    """The folder's cost table with its run's single-device graphs as graph_seconds, and shared and
    free graph times of those times the factors given."""
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    graph = place_calibration.graph_seconds(found)
    costs = CostTable.from_json((folder / "costs.json").read_text())
    return replace(costs, graph_seconds=graph,
                   graph_seconds_shared={d: t * shared for d, t in graph.items()} if shared else None,
                   graph_seconds_free={d: t / free for d, t in graph.items()} if free else None), found


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_the_shared_factor_slows_what_keeps_both_devices_busy_and_no_single_device(folder):
    costs, found = table_with(folder, shared=SHARED)
    alone = place_calibration.predictions(folder, costs.calibrated())
    shared = place_calibration.predictions(folder, costs.calibrated(), Contention.of(costs))
    for single in place_calibration.SINGLES:
        measured = found[single]["seconds"]
        assert alone[single] == pytest.approx(measured) and shared[single] == pytest.approx(measured)
    # one slot on each device, busy at once: the slower device's work is stretched while the other runs
    assert alone["replicas"] * 1.05 < shared["replicas"] <= alone["replicas"] * SHARED * (1 + 1e-9)
    for name in shared:
        assert alone[name] * (1 - 1e-9) <= shared[name] <= alone[name] * SHARED * (1 + 1e-9), name


def test_free_slots_predicted_fastest_are_chosen_by_the_table_and_by_plan(tmp_path):
    folder = place_table.RECORDED / "moe-decode.different"
    costs, found = table_with(folder, shared=SHARED, free=FREE)
    predicted = place_calibration.predictions(folder, costs.calibrated(), Contention.of(costs))
    pick = chosen({name: {**found[name], "predicted_seconds": p} for name, p in predicted.items()})
    assert pick.endswith(", slots free"), pick
    without = place_calibration.predictions(folder, costs.calibrated())
    assert not chosen({n: {**found[n], "predicted_seconds": p} for n, p in without.items()}).endswith("slots free")
    path = tmp_path / "costs.json"
    path.write_text(costs.to_json())
    result = CliRunner().invoke(app, ["plan", str(folder / "program.json.gz"), str(path), "--policy", "all",
                                      "--in-flight", "2", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "requests in flight the fastest is" in x)
    assert ", slots free (" in line, line
