"""The Qwen2-MoE decode fault on the H200, found on the CPU from the recorded program.

``python -m bench.edge_cost`` of 2026-12-02 ran Qwen2-MoE decode's ``cut 5`` on one H200's two
partitions, and a gather tripped a device-side assert that ended the CUDA context
(docs/validation/h200-2026-12-02/edge_qwen2moe_fault.txt). The cause is in the recorded program
(tests/data/h200-place-pairs/hf-qwen2moe-decode.same): ``aten.sort`` (launches 83-87) fills an
index workspace at buffer 8 [2560, ...) with one kernel (84, a conservative write) and copies it
into its index output with a memcpy node (85, an exact read of [2560, 2624)). Launch 73 (on b in
cut 5) had left other bytes there, and the plan copied them to a right before 85, after 84's fill:
the sort's indices became a SiLU's bf16 bytes, and the gather reading them asserted. The same
happened in the second MoE layer (165/166). Here: the independent check names exactly those two
reads under that copy placement, today's transfers deliver launch 73's bytes before the sort
starts, and no planner splits such a call any more.
"""

import json
from pathlib import Path

import pytest

from bench import place_calibration, place_table
from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.ir import Program
from kernelfleet.plan import command
from kernelfleet.plan import transfers as transfers_module
from kernelfleet.plan.delivery import stale_reads
from kernelfleet.plan.edgerun import edge_plans
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.model import Device, Plan
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.transfers import transfers
from kernelfleet.plan.validate import violations
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.executor import plan_graph

pytestmark = pytest.mark.replay

FOLDER = place_table.RECORDED / "hf-qwen2moe-decode.same"


@pytest.fixture(scope="module")
def program() -> Program:
    return Program.load(FOLDER / "program.json.gz")


def cut_5_as_run(program: Program) -> list[str]:
    """``cut 5`` as bench.edge_cost placed it on the H200: the capture order in five segments, the
    second and fourth on b, pinned launches home."""
    n = len(program.launches)
    bounds = [round(j * n / 5) for j in range(6)]
    return ["b" if any(bounds[j] <= k < bounds[j + 1] for j in (1, 3)) and not program.launches[k].pinned else "a"
            for k in range(n)]


def test_the_copy_that_faulted_lands_after_the_sorts_fill_and_the_check_names_both_reads(program, monkeypatch):
    assignment = cut_5_as_run(program)
    assert (assignment[73], assignment[83:88], assignment[154], assignment[164:169]) == (
        "b", ["a"] * 5, "b", ["a"] * 5)
    monkeypatch.setattr(transfers_module, "together", lambda *_: [])  # copies right before their reader, as then
    then = schedule(program, assignment, "a", True, True)
    late = [n.copy for n in then if n.copy is not None and n.copy.reader in (85, 166)]
    assert [(t.writer, t.before, t.buffer, t.offset_bytes, t.length_bytes) for t in late] == [
        (73, 85, 8, 2560, 64), (154, 166, 8, 4608, 64)]
    assert stale_reads(program, assignment, "a", then, True) == [
        ("launch 85 (aten.sort.default) on a reads buffer 8 [2560, 2624) as launch 73 left it; one device reads it "
        "as launch 84 left it"),
        ("launch 166 (aten.sort.default) on a reads buffer 8 [4608, 4672) as launch 154 left it; one device reads it "
        "as launch 165 left it")]


def test_today_the_bytes_arrive_before_the_sort_starts(program):
    assignment = cut_5_as_run(program)
    early = [t for t in transfers(program, assignment, "a", True) if t.reader in (85, 166)]
    assert [(t.writer, t.before) for t in early] == [(73, 83), (154, 164)]
    assert stale_reads(program, assignment, "a", schedule(program, assignment, "a", True, True), True) == []
    # and the plan is refused anyway: it splits aten.topk (80 on b, 81 on a), whose gather's stale
    # pointer words look like a workspace the call passes to its sort
    problem = runtime_plans.problem(program, [Device("a"), Device("b")])
    assert violations(problem, Plan("cut 5", assignment, 0.0))[0].startswith(
        "launches 80-81 (aten.topk.default) pass data through their op call's own workspace")


def test_the_edge_experiment_and_every_planner_keep_such_calls_whole(program):
    problem = runtime_plans.problem(program, [Device("a"), Device("b")])
    assert [program.launches[g[0]].op for g in problem.groups].count("aten.sort.default") == 2
    for name, _, assignment in edge_plans(program, "a", "b"):
        assert violations(problem, Plan(name, assignment, 0.0)) == [], name
        plan_graph([(program, assignment, "a")], resident_state=True)  # no race, no stale read
    setup = command.setup(FOLDER / "program.json.gz", FOLDER / "costs.json", ["a", "b"], [], LINK_GBPS, [], [],
                          None, COPY_US)
    _, plans = command.make_plans(setup.problem, "all", 10.0, in_flight=2)
    assert {p.policy for p in plans} >= {"throughput-milp", "latency-greedy", "pipeline"}
    for plan in plans:
        assert violations(setup.problem, plan) == [], plan.policy


def test_the_two_recorded_plans_that_split_the_sort_are_refused_and_not_predicted():
    costs = CostTable.from_json((FOLDER / "costs.json").read_text())
    _, kept, refused = place_calibration.slot_strategies(FOLDER, costs)
    assert sorted(refused) == ["latency-greedy", "throughput-milp", "throughput-milp, slots free",
                               "throughput-milp, slots scheduled"]
    assert all("launches 83-87 (aten.sort.default)" in why for why in refused.values())
    recorded = json.loads(Path(FOLDER / "disagg.json").read_text())["strategies"]
    assert all(recorded[name]["gate"] == "identical" for name in refused)  # they ran right, by luck (docs)
    assert {s.name for s in kept} >= {"single:a", "single:b", "replicas", "pipeline"}
