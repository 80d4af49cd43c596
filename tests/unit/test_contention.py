"""What the devices of a graph do to each other (plan/contention.py) on a synthetic decode step
whose two devices have the same costs: a device alone keeps its graph time, two devices busy at
once each take their shared graph time, free slots on one device share it by its measured free
speedup, and the planner's ranking picks free slots where they are predicted fastest."""

from dataclasses import replace

import pytest

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.plan.baselines import baselines
from kernelfleet.plan.contention import Contention
from kernelfleet.plan.model import Link, Problem
from kernelfleet.plan.slots import per_request, per_request_modes
from kernelfleet.plan.synthetic import layered

pytestmark = pytest.mark.unit

SHARED, FREE = 1.15, 1.8  # each device's graph with the other busy / alone; work per second of 2 free chains


def twins(shared: float | None = None, free: float | None = None) -> tuple[Problem, dict, float]:
    """The synthetic step on two devices that both take the first one's costs, with graph times
    (their column sums: calibration changes nothing) and, where given, shared and free ones."""
    base = layered(2, 2)
    a, b = base.names
    rows = [{a: row[a], b: row[a]} for row in base.costs.seconds]
    whole = sum(row[a] for row in rows)
    graph = {a: whole, b: whole}
    costs = CostTable(rows, "twins", graph_seconds=graph,
                      graph_seconds_shared={d: t * shared for d, t in graph.items()} if shared else None,
                      graph_seconds_free={d: t / free for d, t in graph.items()} if free else None)
    problem = Problem(base.program, base.devices, [Link(a, b, base.bandwidth[a, b])], costs.calibrated())
    return problem, {p.policy: p for p in baselines(problem)[0]}, whole


def test_the_free_gain_is_one_for_one_node_measured_at_the_copies_and_flat_beyond():
    c = Contention(free={"x": 1.6})
    assert [c.gain("x", k) for k in (1, 2, 3, 8)] == [1.0, 1.6, 1.6, 1.6]
    assert Contention(free={"x": 1.6}, copies=3).gain("x", 2) == pytest.approx(1.3)
    assert c.gain("unmeasured", 4) == 1.0  # no gain assumed where nothing was measured


def test_two_devices_busy_at_once_take_their_shared_time_and_one_alone_does_not():
    problem, plans, whole = twins(shared=SHARED)
    a, _ = problem.names
    # replicas of two slots: one on each device, both busy throughout
    assert per_request_modes(problem, plans["replicas"], 2)["sequential"] == pytest.approx(whole * SHARED / 2)
    alone, _, _ = twins()
    assert per_request(alone, plans["replicas"], 2) == pytest.approx(whole / 2)  # without it: the graphs alone
    for mode, seconds in per_request_modes(problem, plans[f"single:{a}"], 2).items():
        assert seconds == pytest.approx(whole), mode  # nothing else runs: no contention


def test_free_slots_on_one_device_share_it_by_the_measured_speedup():
    problem, plans, whole = twins(free=FREE)
    a, _ = problem.names
    modes = per_request_modes(problem, plans[f"single:{a}"], 2)
    assert modes["sequential"] == pytest.approx(whole)
    assert modes["free"] == pytest.approx(whole / FREE)  # both chains at once, each at FREE / 2 of alone
    assert per_request(problem, plans[f"single:{a}"], 2) == modes["free"]  # the fastest mode is the prediction
    # replicas' slots are on different devices: nothing shares a device, free gains nothing
    replicas = per_request_modes(problem, plans["replicas"], 2)
    assert replicas["free"] == pytest.approx(replicas["sequential"])


def test_the_in_flight_policy_chooses_free_slots_where_they_are_predicted_fastest():
    from kernelfleet.plan.command import make_plans

    problem, _, whole = twins(shared=SHARED, free=FREE)
    chosen, _ = make_plans(problem, "throughput", 10.0, in_flight=2)
    flight = chosen.details.in_flight
    # replicas: whole x SHARED / 2 per request; one device with free slots: whole / FREE / 2 x 2 slots
    assert flight.per_request_seconds < whole * SHARED / 2
    assert not flight.replicas_faster
    modes = per_request_modes(problem, chosen, 2)
    assert min(modes, key=modes.get) == "free"


def test_a_shared_or_free_time_needs_the_graph_alone_and_a_known_device():
    base = layered(1, 2)
    a = base.names[0]
    rows = base.costs.seconds
    with pytest.raises(UsageError, match="graph_seconds_shared: device .* has no graph_seconds"):
        CostTable.from_json(CostTable(rows).to_json()[:-1] + f', "graph_seconds_shared": {{"{a}": 1e-4}}}}')
    with pytest.raises(UsageError, match="graph_seconds_free.z"):
        CostTable.from_json(replace(CostTable(rows), graph_seconds={a: 1e-3}).to_json()[:-1]
                            + ', "graph_seconds_free": {"z": -1}}')
    table = replace(CostTable(rows), graph_seconds={a: 1e-3}, graph_seconds_free={a: 5e-4})
    assert table.free_speedups() == {a: 2.0} and table.shared_factors() == {}
    assert table.restricted([a]).graph_seconds_free == {a: 5e-4}


def test_the_together_graph_scales_the_shared_factors_so_the_model_predicts_it():
    """Twins of equal graphs, each shared factor 1.15 as looping measures it, measured together once at
    1.06x alone: the predictions share by 1.06 (k = 0.4 of each factor's excess), and replicas of two
    slots come out as that measurement; one that says the pair ran faster together than alone
    leaves no contention; a table that keeps it for other than two shared devices is refused."""
    problem, plans, whole = twins(shared=SHARED)
    a, b = problem.names
    table = replace(problem.costs, graph_seconds_together=whole * 1.06)
    assert table.contention_factors() == {a: pytest.approx(1.06), b: pytest.approx(1.06)}
    assert Contention.of(table).shared == table.contention_factors()
    base = layered(2, 2)
    again = Problem(base.program, base.devices, [Link(a, b, base.bandwidth[a, b])], table)
    assert per_request_modes(again, plans["replicas"], 2)["sequential"] == pytest.approx(whole * 1.06 / 2)
    assert replace(table, graph_seconds_together=whole * 0.99).contention_factors() == {a: 1.0, b: 1.0}
    assert table.restricted([a]).graph_seconds_together is None and table.restricted([a, b]) == table
    with pytest.raises(UsageError, match="graph_seconds_together: it is of the two devices of graph_seconds_shared"):
        CostTable.from_json(replace(problem.costs, graph_seconds_shared=None).to_json()[:-1]
                            + f', "graph_seconds_together": {whole}}}')
