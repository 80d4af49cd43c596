"""The throughput plan for a few requests in flight: the MILP's switch budget holds (with and
without layer compression, on two and three devices), a vacuous budget changes nothing, the
enumerated one-cut plan is the one-switch MILP's optimum, and the in-flight policy returns the
plan ``runtime/slots.per_request`` predicts fastest, never one slower than a baseline."""

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.plan import command
from kernelfleet.plan.baselines import baselines
from kernelfleet.plan.milp import solve_throughput, switches
from kernelfleet.plan.model import Plan
from kernelfleet.plan.policy import best_cut, throughput
from kernelfleet.plan.slots import per_request
from kernelfleet.plan.synthetic import layered, random_dag
from kernelfleet.plan.validate import violations

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("devices, seed, pins", [(2, 1, 0), (2, 2, 2), (3, 3, 0)])
@pytest.mark.parametrize("budget", [0, 1, 2, 3])
def test_the_switch_budget_holds(devices, seed, pins, budget):
    problem = random_dag(16, devices, seed, pins=pins)
    plan = solve_throughput(problem, time_limit_seconds=10, max_switches=budget)
    assert switches(problem, plan.assignment) == plan.details.switches <= budget
    assert not violations(problem, plan)


def test_the_switch_budget_holds_under_layer_compression():
    """Every layer placed alike: a switch inside the block counts once per layer."""
    problem = layered(4, 2)
    free = solve_throughput(problem, time_limit_seconds=10, compress=True)
    assert free.details.switches == switches(problem, free.assignment) > 8
    for budget in (1, 4, 8):
        plan = solve_throughput(problem, time_limit_seconds=10, compress=True, max_switches=budget)
        assert switches(problem, plan.assignment) == plan.details.switches <= budget


@pytest.mark.parametrize("devices, seed", [(2, 4), (3, 5)])
def test_a_budget_that_cannot_bind_gives_the_unconstrained_optimum(devices, seed):
    problem = random_dag(14, devices, seed)
    free = solve_throughput(problem, time_limit_seconds=20, mip_rel_gap=0.0)
    loose = solve_throughput(problem, time_limit_seconds=20, mip_rel_gap=0.0, max_switches=13)
    assert free.details.status == loose.details.status == "Optimal"
    assert loose.objective_seconds == pytest.approx(free.objective_seconds, rel=1e-9)
    assert loose.lower_bound_seconds <= free.lower_bound_seconds  # a budget's MILP bounds are not the problem's


@pytest.mark.parametrize("seed, pins", [(6, 0), (7, 3)])
def test_the_enumerated_cut_is_the_one_switch_optimum(seed, pins):
    problem = random_dag(18, 2, seed, pins=pins)
    cut = best_cut(problem)
    milp = solve_throughput(problem, time_limit_seconds=20, mip_rel_gap=0.0, max_switches=1)
    assert milp.details.status == "Optimal"
    assert switches(problem, cut.assignment) <= 1
    assert cut.objective_seconds == pytest.approx(milp.objective_seconds, rel=1e-9)
    assert best_cut(random_dag(8, 3, seed)) is None  # enumerated on two devices only


def test_a_negative_budget_is_refused():
    with pytest.raises(UsageError, match="max_switches"):
        solve_throughput(random_dag(6, 2, 1), max_switches=-1)
    with pytest.raises(UsageError, match="in flight must be at least 1"):
        throughput(random_dag(6, 2, 1), in_flight=0)


def test_with_three_in_flight_one_cut_beats_the_milp_that_switches_every_layer():
    """The synthetic decode step (2 layers, l40s + a100): the MILP sends each layer's attention to
    the a100 and back, so one request is a chain through both devices, and three in flight
    overlap worse than a pipeline with one cut."""
    problem = layered(2, 2)
    free = solve_throughput(problem, time_limit_seconds=10)
    cut = best_cut(problem)
    assert switches(problem, free.assignment) >= 4
    assert per_request(problem, cut, 3) < per_request(problem, free, 3)
    plan, _, _ = throughput(problem, time_limit_seconds=10, in_flight=3)
    flight = plan.details.in_flight
    assert switches(problem, plan.assignment) == flight.switches == 1
    assert plan.objective_seconds == pytest.approx(per_request(problem, cut, 3))
    unbounded = next(c for c in flight.candidates if c.plan == "no switch budget")
    assert unbounded.switches >= 4 and unbounded.per_request_seconds > plan.objective_seconds


@pytest.mark.parametrize("problem", [layered(2, 2), random_dag(20, 2, 8, pins=2)], ids=["layered", "random"])
@pytest.mark.parametrize("in_flight", [1, 3])
def test_the_in_flight_plan_is_never_predicted_slower_than_a_baseline(problem, in_flight):
    plan, plans, _ = throughput(problem, time_limit_seconds=10, in_flight=in_flight)
    assert plan.policy == "throughput-milp" and len(plan.assignment) == len(problem.program.launches)
    assert not violations(problem, plan)
    assert plan.objective_seconds == pytest.approx(per_request(problem, plan, in_flight))
    placed = [per_request(problem, p, in_flight) for p in plans if p.assignment]
    assert plan.objective_seconds <= min(placed) * (1 + 1e-12)
    assert plan.lower_bound_seconds <= plan.objective_seconds
    flight = plan.details.in_flight
    assert flight.requests == in_flight
    names = {c.plan for c in flight.candidates}
    assert {"replicas", "pipeline", "at most 1 switch", "at most 2 switches", "no switch budget"} <= names
    replicas = per_request(problem, next(p for p in plans if p.policy == "replicas"), in_flight)
    assert flight.replicas_faster == (replicas < plan.objective_seconds)
    assert (flight.note is not None) == flight.replicas_faster
    again = Plan.from_json(plan.to_json())  # what bench disagg loads: every launch placed
    assert again.assignment == plan.assignment and again.details.in_flight == flight


def test_the_command_feeds_requests_in_flight_to_the_throughput_plan():
    problem = layered(2, 2)
    _, plans = command.make_plans(problem, "all", 5.0, in_flight=3)
    assert plans[0].policy == "throughput-milp" and plans[0].details.in_flight.requests == 3
    assert command.verdict(plans).startswith("with 3 requests in flight, ")
    _, steady = command.make_plans(problem, "throughput", 5.0)
    assert steady[0].details.in_flight is None
    with pytest.raises(UsageError, match="--in-flight must be at least 1"):
        command.make_plans(problem, "all", 5.0, in_flight=0)


def test_the_verdict_with_requests_in_flight():
    def milp(mine: float, replicas: float) -> list[Plan]:
        flight = {"requests": 3, "chosen": "at most 1 switch", "per_request_seconds": mine,
                  "candidates": [{"plan": "replicas", "per_request_seconds": replicas}]}
        return [Plan("throughput-milp", ["a"], mine, details={"throughput_seconds": 0.1, "in_flight": flight}),
                Plan("replicas", [], 0.2, details={"throughput_seconds": 0.2})]

    assert command.verdict(milp(0.5, 0.6)).startswith("with 3 requests in flight, kernel placement (at most 1 "
                                                      "switch) serves 1.20x")
    assert "run replicas on this pair" in command.verdict(milp(0.7, 0.5))


def test_baselines_are_candidates_with_their_own_home():
    """A re-homed baseline (the whole step on one device) can be the answer; it keeps its home."""
    problem = random_dag(12, 2, 9, pins=1)
    plan, plans, _ = throughput(problem, time_limit_seconds=5, in_flight=1)
    best = min((per_request(problem, p, 1), p.policy) for p in plans if p.assignment)
    assert plan.objective_seconds <= best[0] * (1 + 1e-12)
    assert plan.details.home in problem.names
    assert per_request(problem, plan, 1) == pytest.approx(plan.objective_seconds)
    assert baselines(problem)[0]  # the candidates came from the same baselines
