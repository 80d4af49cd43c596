"""Plans as the runtime takes them (runtime/plans.py): every plan file and every slot a strategy
builds passes the validator — launch count, device names, pins, memory — against the Problem of
the step as captured, and a plan that fails says which file or strategy and why, in one line.
Pure: these run without torch."""

import math

import pytest

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Access, Buffer, Launch, Program
from kernelfleet.plan.model import Device, Plan
from kernelfleet.runtime.plans import check_slots, checked, load, problem, read

pytestmark = pytest.mark.unit

GB = 10**9
DEVICES = ["compute", "bandwidth"]


def program(pinned: int | None = None, weight_bytes: int = GB) -> Program:
    """Three launches in a chain (launch k writes buffer k, the next reads it); launch 1 also reads
    a weight of ``weight_bytes``; launch ``pinned`` is pinned."""
    buffers = [Buffer(k, 0, k << 32, 1, "activation") for k in range(3)] + [Buffer(3, 0, 3 << 32, weight_bytes, "weight")]
    accesses = [[Access(0, 0, 1, "write", "schema")],
                [Access(0, 0, 1, "read", "schema"), Access(1, 0, 1, "write", "schema"),
                 Access(3, 0, weight_bytes, "read", "schema")],
                [Access(1, 0, 1, "read", "schema"), Access(2, 0, 1, "write", "schema")]]
    launches = [Launch(k, "kernel", f"k{k}", tuple(a), pinned="global variable" if k == pinned else None)
                for k, a in enumerate(accesses)]
    return Program(buffers, launches)


def write(path, plan: Plan):
    path.write_text(plan.to_json())
    return path


def test_without_a_cost_table_every_device_runs_every_launch_at_no_known_time():
    found = problem(program(), [Device(d) for d in DEVICES])
    assert found.names == DEVICES and found.home == "compute"
    assert found.costs is None
    assert all(found.runs(k, d) for k in range(3) for d in DEVICES)
    with pytest.raises(UsageError, match="no cost table: its plans can be checked, not timed"):
        found.cost(0, "compute")
    assert found.bandwidth["compute", "bandwidth"] == math.inf


def test_a_cost_table_says_what_each_device_can_run_and_must_fit_the_step():
    costs = CostTable([{"compute": 1.0, "bandwidth": 2.0, "whole": 0.5}, {"compute": 1.0, "bandwidth": None},
                       {"compute": 1.0, "bandwidth": 1.0}], "measured")
    found = problem(program(), [Device(d) for d in DEVICES], costs)
    assert found.costs.seconds[0] == {"compute": 1.0, "bandwidth": 2.0}  # profiles the run lacks are left out
    with pytest.raises(UsageError, match="no cost for it"):
        checked(found, Plan("x", ["compute", "bandwidth", "compute"], 0.1), "x.json")
    with pytest.raises(UsageError, match="the cost table has 2 launches, the captured step 3: it was made for another"):
        problem(program(), [Device(d) for d in DEVICES], CostTable(costs.seconds[:2], "measured"))


def test_a_plan_file_failing_the_validator_names_the_file_and_why_in_one_line(tmp_path):
    pinned = problem(program(pinned=1), [Device(d) for d in DEVICES])
    path = write(tmp_path / "moved.json", Plan("moved", ["compute", "bandwidth", "compute"], 0.1))
    with pytest.raises(UsageError) as found:
        load(path, pinned)
    line = str(found.value)
    assert line.startswith(f"{path}: invalid moved plan: launch 1 is pinned") and "\n" not in line
    # a single-device plan re-homes the step: its pins hold there
    write(path, Plan("single:bandwidth", ["bandwidth"] * 3, 0.1, details={"home": "bandwidth"}))
    assert list(load(path, pinned)) == ["single:bandwidth"]


def test_memory_and_device_names_are_checked(tmp_path):
    small = problem(program(weight_bytes=8 * GB), [Device("compute", 4 * GB), Device("bandwidth", 16 * GB)])
    heavy = write(tmp_path / "heavy.json", Plan("heavy", ["compute"] * 3, 0.1))
    with pytest.raises(UsageError, match=r"heavy.json: invalid heavy plan: device compute needs \d+ bytes, limit"):
        load(heavy, small)
    write(heavy, Plan("heavy", ["compute", "bandwidth", "compute"], 0.1))
    assert list(load(heavy, small)) == ["heavy"]
    elsewhere = write(tmp_path / "elsewhere.json", Plan("elsewhere", ["a100"] * 3, 0.1, details={"home": "compute"}))
    with pytest.raises(UsageError, match="elsewhere.json: invalid elsewhere plan: launch 0 uses a100, an unknown device"):
        load(elsewhere, small)


def test_a_folder_loads_every_plan_by_policy_less_request_distribution_and_the_program(tmp_path):
    write(tmp_path / "a.json", Plan("pipeline", ["compute", "compute", "bandwidth"], 0.1))
    write(tmp_path / "replicas.json", Plan("replicas", [], 0.1, details={"replicas": DEVICES}))
    (tmp_path / "notes.txt").write_text("not a plan")
    program().save(tmp_path / "program.json")  # kernelfleet plan --policy all writes the program beside its plans
    assert list(load(tmp_path, problem(program(), [Device(d) for d in DEVICES]))) == ["pipeline"]
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(UsageError, match="broken.json: not a plan"):
        load(tmp_path, problem(program(), [Device(d) for d in DEVICES]))
    with pytest.raises(UsageError, match="nowhere: no such plan file or folder"):
        load(tmp_path / "nowhere", problem(program(), [Device(d) for d in DEVICES]))
    costs = tmp_path / "costs.json"
    costs.write_text(CostTable([{"compute": 1.0}], "measured").to_json())
    with pytest.raises(UsageError, match="costs.json: .*expected kernelfleet_plan=1"):
        read(costs)


def test_every_slot_a_strategy_builds_passes_the_validator():
    pinned = problem(program(pinned=0), [Device(d) for d in DEVICES])
    check_slots(pinned, "replicas", [["compute"] * 3, ["bandwidth"] * 3], ["compute", "bandwidth"])
    with pytest.raises(UsageError, match="^halves, slot 1: invalid slot plan: launch 0 is pinned"):
        check_slots(pinned, "halves", [["compute"] * 3, ["bandwidth", "compute", "compute"]], ["compute"] * 2)
    with pytest.raises(UsageError, match="2 slot placements for 1 homes"):
        check_slots(pinned, "odd", [["compute"] * 3] * 2, ["compute"])
