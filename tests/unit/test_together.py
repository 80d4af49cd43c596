"""Op calls that pass data through their own workspace: kept whole on one device, and fed before they start.

The program below is ``aten.sort``'s shape on an H200 (tests/data/h200-place-pairs, Qwen2-MoE
decode, launches 83-87): one kernel fills an index workspace the op's schema does not name (a
conservative write), a memcpy node of the same call reads it back exactly; an earlier op had left
other bytes there. A copy of those earlier bytes that lands between the two puts them back over
the fill: that is what faulted the H200 (test_sort_workspace_h200.py replays it).
"""

import pytest

from kernelfleet.costs.table import CostTable
from kernelfleet.graph.deps import Flow, flows, together
from kernelfleet.kernels.ir import Access, Buffer, Launch, Program
from kernelfleet.plan import policy
from kernelfleet.plan.delivery import stale_reads
from kernelfleet.plan.edgerun import edge_plans
from kernelfleet.plan.model import Device, Link, Plan, Problem
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.transfers import transfers
from kernelfleet.plan.validate import violations

pytestmark = pytest.mark.unit

SORT = "aten.sort.default"


def program() -> Program:
    buffers = [Buffer(0, 0, 0x1000, 64, "input", "input0"), Buffer(1, 0, 0x2000, 256, "activation"),
               Buffer(2, 0, 0x3000, 64, "activation"), Buffer(3, 0, 0x4000, 64, "output", "output0")]
    launches = [
        Launch(0, "kernel", "silu", (Access(0, 0, 64, "read", "schema"), Access(1, 0, 64, "write", "schema")),
               op="aten.silu.default", op_index=0),
        # the fill: a pointer the schema does not name, so from it to the end of its buffer
        Launch(1, "kernel", "arange", (Access(1, 0, 256, "readwrite", "conservative"),), op=SORT, op_index=1),
        Launch(2, "memcpy", "memcpy", (Access(1, 0, 64, "read", "graph-node"), Access(2, 0, 64, "write", "graph-node")),
               op=SORT, op_index=1),
        Launch(3, "kernel", "gather", (Access(2, 0, 64, "read", "schema"), Access(3, 0, 64, "write", "schema")),
               op="aten.index.Tensor", op_index=2),
    ]
    return Program(buffers, launches)


def problem(seconds: list[dict[str, float]] | None = None) -> Problem:
    costs = None if seconds is None else CostTable(seconds, "test")
    return Problem(program(), [Device("a"), Device("b")], [Link("a", "b", 1e12, 1e-6)], costs)


def test_the_memcpy_reads_both_the_earlier_op_and_its_own_calls_fill():
    found, _ = flows(program())
    assert Flow(0, 2, 1, 0, 64) in found and Flow(1, 2, 1, 0, 64, scratch=True) in found
    assert together(program(), found) == [(1, 2)]


def test_what_the_call_reads_from_another_device_arrives_before_its_first_kernel():
    assignment = ["b", "a", "a", "a"]
    copies = [t for t in transfers(program(), assignment, "a") if t.writer == 0]
    assert [(t.before, t.reader, t.src, t.dst) for t in copies] == [(1, 2, "b", "a")]
    nodes = schedule(program(), assignment, "a")
    assert stale_reads(program(), assignment, "a", nodes) == []
    # the copy where it landed before (right before its reader): after the fill, over it
    late = nodes[:]
    copy = late.pop(next(k for k, n in enumerate(late) if n.copy is not None and n.copy.writer == 0))
    late.insert(next(k for k, n in enumerate(late) if n.launch == 2), copy)
    assert stale_reads(program(), assignment, "a", late) == [
        ("launch 2 (aten.sort.default) on a reads buffer 1 [0, 64) as launch 0 left it; one device reads it as "
        "launch 1 left it")]


def test_a_plan_that_splits_the_call_is_refused():
    assert violations(problem(), Plan("x", ["a", "a", "a", "a"], 0.0)) == []
    found = violations(problem(), Plan("x", ["a", "b", "a", "a"], 0.0))
    assert found == [("launches 1-2 (aten.sort.default) pass data through their op call's own workspace, so they "
                     "run on one device; the plan puts them on a, b")]


def test_no_planner_splits_the_call_even_where_splitting_it_would_be_fastest():
    # the fill is far faster on b, its memcpy on a: placed launch by launch, the call would split
    seconds = [{"a": 1e-3, "b": 1e-3}, {"a": 5e-3, "b": 1e-6}, {"a": 1e-6, "b": 5e-3}, {"a": 1e-3, "b": 1e-3}]
    p = problem(seconds)
    chosen, plans, _ = policy.throughput(p, time_limit_seconds=5)
    every = [chosen, *plans, policy.best_cut(p)]
    assert {plan.policy for plan in every} >= {"throughput-milp", "pipeline", "latency-greedy", "best-cut"}
    for plan in every:
        if plan.assignment:
            assert plan.assignment[1] == plan.assignment[2], plan.policy
            assert violations(p, plan) == [], plan.policy
    chosen, _, _ = policy.throughput(p, time_limit_seconds=5, in_flight=2)
    assert chosen.assignment[1] == chosen.assignment[2]


def test_the_edge_experiment_moves_the_call_whole():
    for name, _, assignment in edge_plans(program(), "a", "b"):
        assert assignment[1] == assignment[2], name
