"""Slots of a plan in one graph (plan/slots.py) on the recorded 8B decode step and its
per-kernel profile: the orders are topological and keep each slot's own dependencies, each
stream is one chain where the mode says so, and the list-scheduled order is predicted to beat the
sequential one on a plan that switches devices every few kernels."""

import json
from pathlib import Path

import pytest

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import kernel_kind
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.slots import estimate, makespan, pipeline, uniform_link

pytestmark = pytest.mark.unit

HERE = Path(__file__).parents[1] / "data" / "h200-capture"


@pytest.fixture(scope="module")
def decode():
    """The 8B decode step with GEMMs on "compute" and the rest on "bandwidth" (a plan that switches
    devices several times a layer, as the throughput MILP's does), and its measured costs."""
    program = assemble(RawCapture.load(HERE / "llama8b-decode.capture.json.gz"))
    assignment = ["compute" if kernel_kind(x) == "tensor-core" else "bandwidth" for x in program.launches]
    profile = json.loads((HERE / "llama8b-decode.profile.json").read_text())["profiles"]
    costs = CostTable([{d: profile[d]["seconds"][i] for d in ("compute", "bandwidth")}
                       for i in range(len(program.launches))])
    order = schedule(program, assignment, "bandwidth", resident_state=True)
    return order, estimate(costs, uniform_link(10.0, 100.0))


def predicted(combined, seconds) -> float:
    return makespan(combined, lambda x: seconds(x.slot, x.node))


@pytest.mark.parametrize("mode", ["sequential", "free", "scheduled"])
def test_the_combined_list_is_topological_and_keeps_each_slots_dependencies(decode, mode):
    order, seconds = decode
    combined = pipeline([order] * 3, mode, seconds)
    assert len(combined) == 3 * len(order)
    position = {(x.slot, x.node.index): k for k, x in enumerate(combined)}
    for k, x in enumerate(combined):
        assert all(d < k for d in x.deps)
        mine = {combined[d].node.index for d in x.deps if combined[d].slot == x.slot}
        assert mine == set(x.node.deps)  # nothing added or lost inside a slot: its race check still holds
        assert all(position[x.slot, d] < k for d in x.node.deps)
    crossing = [x for x in combined if any(combined[d].slot != x.slot for d in x.deps)]
    assert (mode == "free") == (not crossing)


@pytest.mark.parametrize("mode", ["sequential", "scheduled"])
def test_each_stream_is_one_chain(decode, mode):
    order, seconds = decode
    combined = pipeline([order] * 3, mode, seconds)
    previous = {}
    for k, x in enumerate(combined):
        p = previous.get(x.node.stream)
        if p is not None and combined[p].slot != x.slot:
            assert p in x.deps
        previous[x.node.stream] = k


def test_sequential_slots_start_a_stream_after_the_last_slot_is_done_with_it(decode):
    order, seconds = decode
    combined = pipeline([order] * 2, "sequential", seconds)
    assert [x.slot for x in combined] == [0] * len(order) + [1] * len(order)
    first = next(x for x in combined if x.slot == 1 and x.node.stream == "compute:compute")
    last = max(k for k, x in enumerate(combined) if x.slot == 0 and x.node.stream == "compute:compute")
    assert last in first.deps


def test_scheduled_slots_overlap_where_sequential_ones_cannot(decode):
    order, seconds = decode
    one = predicted(pipeline([order], "sequential", seconds), seconds)
    busy = {d: sum(seconds(0, n) for n in order if n.launch is not None and n.devices[0] == d)
            for d in ("compute", "bandwidth")}
    assert one > 0.9 * sum(busy.values())  # one slot is a chain through both devices
    sequential = predicted(pipeline([order] * 4, "sequential", seconds), seconds)
    scheduled = predicted(pipeline([order] * 4, "scheduled", seconds), seconds)
    assert sequential > 0.95 * 4 * one  # slots one after another: no overlap
    assert scheduled < 0.9 * sequential
    assert scheduled >= 4 * max(busy.values())  # no device does more than its work


def test_modes_are_checked(decode):
    order, _ = decode
    with pytest.raises(UsageError, match="unknown slot mode"):
        pipeline([order], "round-robin")
    with pytest.raises(UsageError, match="estimated seconds"):
        pipeline([order], "scheduled")


def test_requests_in_flight_under_single_device_and_replica_plans():
    from kernelfleet.plan.baselines import baselines
    from kernelfleet.plan.slots import per_request
    from kernelfleet.plan.synthetic import layered

    problem = layered(2, 2)
    plans = {p.policy: p for p in baselines(problem)[0]}
    n = len(problem.program.launches)
    whole = {d: sum(problem.cost(k, d) for k in range(n)) for d in problem.names}
    for d in problem.names:  # one device, one chain: in flight or not, a request takes the whole step
        assert per_request(problem, plans[f"single:{d}"], 1) == pytest.approx(whole[d])
        assert per_request(problem, plans[f"single:{d}"], 4) == pytest.approx(whole[d])
    fast, slow = sorted(problem.names, key=whole.get)
    busy = {fast: 0.0, slow: 0.0}
    for _ in range(5):  # each request whole on the device that frees first
        d = min(busy, key=lambda x: busy[x] + whole[x])
        busy[d] += whole[d]
    assert per_request(problem, plans["replicas"], 5) == pytest.approx(max(busy.values()) / 5)
    with pytest.raises(UsageError, match="at least 1"):
        per_request(problem, plans["replicas"], 0)
