"""Placement planning: MILP, baselines and the independent validator, on small exact cases,
seeded random graphs and the committed fixture under tests/data/plan/."""

import dataclasses
import random
from pathlib import Path

import pytest

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Access, Buffer, Launch, Program
from kernelfleet.plan.baselines import latency_greedy
from kernelfleet.plan.compress import Repeats, find_repeats
from kernelfleet.plan.milp import solve_throughput, zero_comm_bound
from kernelfleet.plan.model import Device, Link, Plan, Problem, SolvedRepeats
from kernelfleet.plan.policy import throughput
from kernelfleet.plan.synthetic import layered, random_dag
from kernelfleet.plan.validate import check, evaluate, latency, violations

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent.parent / "data" / "plan"
GB = 10**9


def build(costs, edges=(), weights=None, pins=(), memory=(None, None), bandwidth=1.0 * GB, home=None, names=None):
    """Launch k writes buffer k ("out"); an edge (src, dst, nbytes) is its own buffer written by
    src and read by dst; weights[k] bytes of weight read by launch k."""
    devices = [f"d{i}" for i in range(len(memory))]
    buffers, accesses = [], [[] for _ in costs]

    def add(size, role):
        buffers.append(Buffer(len(buffers), 0, len(buffers) << 32, size, role))
        return len(buffers) - 1

    for k in range(len(costs)):
        accesses[k].append(Access(add(1, "activation"), 0, 1, "write", "schema"))
    for src, dst, nbytes in edges:
        b = add(nbytes, "activation")
        accesses[src].append(Access(b, 0, nbytes, "write", "schema"))
        accesses[dst].append(Access(b, 0, nbytes, "read", "schema"))
    for k, w in enumerate(weights or []):
        if w:
            accesses[k].append(Access(add(w, "weight"), 0, w, "read", "schema"))
    launches = [Launch(k, "kernel", names[k] if names else f"k{k}", tuple(acc), pinned="global variable" if k in pins else None)
                for k, acc in enumerate(accesses)]
    table = CostTable([dict(zip(devices, row)) for row in costs], "hand-built")
    links = [Link(a, b, bandwidth) for i, a in enumerate(devices) for b in devices[i + 1:]]
    return Problem(Program(buffers, launches), [Device(n, m) for n, m in zip(devices, memory)], links, table,
                   home=home)


def test_cheap_edge_splits_expensive_edge_colocates():
    cheap = build([[1.0, 3.0], [3.0, 1.0]], edges=[(0, 1, GB // 10)])
    plan = solve_throughput(cheap)
    assert plan.assignment == ["d0", "d1"]
    assert plan.objective_seconds == pytest.approx(1.1)
    dear = build([[1.0, 3.0], [3.0, 1.0]], edges=[(0, 1, 5 * GB)])
    plan = solve_throughput(dear)
    assert plan.assignment in (["d0", "d0"], ["d1", "d1"]) and plan.objective_seconds == pytest.approx(4.0)


def test_pinned_launch_stays_home():
    problem = build([[3.0, 1.0], [3.0, 1.0]], edges=[(0, 1, 1)], pins=[0])
    plan = solve_throughput(problem)
    assert plan.assignment[0] == "d0"
    moved = Plan("x", ["d1", "d1"], 0.0)
    assert any("pinned" in v for v in violations(problem, moved))
    # a single-device plan re-homes the program: its pins hold there
    assert violations(problem, Plan("single:d1", ["d1", "d1"], 0.0, details={"home": "d1"})) == []


def test_memory_limit_forces_a_split():
    free = build([[1.0, 5.0], [1.0, 5.0]], edges=[(0, 1, GB // 10)], weights=[6 * GB, 6 * GB])
    assert solve_throughput(free).assignment == ["d0", "d0"]
    tight = build([[1.0, 5.0], [1.0, 5.0]], edges=[(0, 1, GB // 10)], weights=[6 * GB, 6 * GB],
                  memory=(10 * GB, 10 * GB))
    plan = solve_throughput(tight)
    assert sorted(plan.assignment) == ["d0", "d1"]
    assert plan.objective_seconds == pytest.approx(5.1)
    assert evaluate(tight, plan).memory_bytes["d0"] <= 10 * GB
    assert any("needs" in v and "limit" in v for v in violations(tight, Plan("x", ["d0", "d0"], 0.0)))


def test_infeasible_inputs_name_the_launch():
    with pytest.raises(UsageError, match="launch 1 .*fits no device"):
        build([[1.0, 1.0], [1.0, 1.0]], weights=[0, 20 * GB], memory=(10 * GB, 10 * GB))
    with pytest.raises(UsageError, match="launch 0 .*pinned"):
        build([[None, 1.0]], pins=[0])
    with pytest.raises(UsageError, match="home device"):
        build([[1.0, 1.0]], home="d7")
    # each fits alone, not all together: the solver says so in one line
    crowded = build([[1.0, 1.0]] * 3, weights=[6 * GB] * 3, memory=(10 * GB, 10 * GB))
    with pytest.raises(UsageError, match="no placement satisfies"):
        solve_throughput(crowded)


def test_validator_rejects_bad_plans():
    problem = build([[1.0, 2.0], [2.0, 1.0]], edges=[(0, 1, 10)], pins=[1])
    assert "exactly once" in violations(problem, Plan("x", ["d0", "d0", "d1"], 0.0))[0]
    assert "unknown device" in violations(problem, Plan("x", ["d0", "gpu9"], 0.0))[0]
    assert "pinned" in violations(problem, Plan("x", ["d0", "d1"], 0.0))[0]
    with pytest.raises(UsageError, match="invalid x plan"):
        check(problem, Plan("x", ["d1", "d1"], 0.0))
    assert violations(problem, Plan("replicas", [], 0.0, details={"replicas": ["d0", "d0"]}))


def test_evaluation_and_latency_by_hand():
    problem = build([[1.0, 3.0], [3.0, 1.0], [1.0, 1.0]], edges=[(0, 1, GB), (1, 2, GB)])
    ev = evaluate(problem, Plan("x", ["d0", "d1", "d0"], 0.0))
    # d0: 1 + 1 compute, two cut edges of 1 s each; d1: 1 compute + the same two transfers
    assert ev.busy_seconds == {"d0": 4.0, "d1": 3.0} and ev.throughput_seconds == 4.0
    # 0 ends at 1, transfer to 2, 1 ends at 3, transfer to 4, 2 ends at 5
    assert ev.latency_seconds == 5.0
    assert latency(problem, ["d0", "d0", "d0"]) == 5.0


def test_a_program_of_units_stalls_both_devices_of_a_copy():
    """Devices that captured different kernels run units, and their executor orders each copy
    after, and before, the neighbouring nodes of both its devices: what runs beside a copy on the
    other device waits for it (the latency model says so; bench disagg measured it)."""
    overlapping = build([[1.0, 9.0], [9.0, 1.0], [1.0, 9.0], [9.0, 2.0]], edges=[(1, 2, GB)])
    units = Problem(dataclasses.replace(overlapping.program, units=True), overlapping.devices,
                    [Link("d0", "d1", GB)], overlapping.costs)
    placed = ["d0", "d1", "d0", "d1"]
    # 0 on d0 and 1 on d1 at [0, 1]; the copy 1 -> 2 at [1, 2]; 2 on d0 at [2, 3]; 3 on d1 at [1, 3] beside
    # the copy, or, with units, at [2, 4] after it
    assert latency(overlapping, placed) == 3.0
    assert latency(units, placed) == 4.0
    assert latency(units, ["d0"] * 4) == latency(overlapping, ["d0"] * 4) == 20.0


@pytest.mark.parametrize("n, devices, seed, pins, bandwidths", [
    (30, 2, 1, 0, None), (45, 2, 2, 2, None), (60, 2, 3, 0, None),
    (30, 3, 4, 0, None), (40, 3, 5, 3, None), (36, 3, 6, 0, [25e9, 50e9, 10e9]),
])
def test_milp_beats_every_kernel_placement_baseline(n, devices, seed, pins, bandwidths):
    problem = random_dag(n, devices, seed, pins=pins, bandwidths=bandwidths)
    plan, plans, skipped = throughput(problem, time_limit_seconds=2.0)
    ev = evaluate(problem, plan)
    # the validator's independent evaluation agrees with the solver's objective
    assert ev.throughput_seconds == pytest.approx(plan.objective_seconds, rel=1e-6)
    assert plan.lower_bound_seconds <= plan.objective_seconds * (1 + 1e-6)
    assert skipped == {}
    for other in plans:
        same_home = other.details.home == problem.home
        if other.policy != "replicas" and (same_home or pins == 0):
            assert plan.objective_seconds <= other.details.throughput_seconds * (1 + 1e-9), other.policy
    # request distribution is a fractional placement, so it never beats the pin-free zero-comm LP
    replicas = next(p for p in plans if p.policy == "replicas")
    assert replicas.objective_seconds >= zero_comm_bound(problem, home=None)["lp"] * (1 - 1e-9)


def test_latency_policy_is_valid_and_no_slower_than_home():
    problem = random_dag(40, 3, 7, pins=2)
    plan = latency_greedy(problem)
    check(problem, plan)
    assert latency(problem, plan.assignment) <= latency(problem, [problem.home] * 40) + 1e-12


def repeated(layers):
    # per layer: a (fast on d0), b (fast on d1), residual edge to the next layer's a
    costs, edges = [], []
    for i in range(layers):
        a, b = 2 * i, 2 * i + 1
        costs += [[1.0, 3.0], [3.0, 1.0]]
        edges.append((a, b, GB // 100))
        if i:
            edges.append((b - 2, a, GB // 100))
    return build(costs, edges=edges, names=["attn", "gemm"] * layers)


def test_repeats_found_and_compression_matches_uncompressed_optimum():
    problem = repeated(4)
    assert find_repeats(problem) == Repeats(start=0, period=2, count=4)
    full = solve_throughput(problem)
    small = solve_throughput(problem, compress=True)
    assert small.details.classes == 2
    assert small.objective_seconds == pytest.approx(full.objective_seconds)
    assert evaluate(problem, small).throughput_seconds == pytest.approx(full.objective_seconds)
    assert small.assignment == ["d0", "d1"] * 4


def test_compressed_layered_problem_is_valid_and_groups_help():
    problem = layered(6, 2)
    one = solve_throughput(problem, compress=True)
    two = solve_throughput(problem, compress=True, groups=2)
    check(problem, one), check(problem, two)
    assert two.objective_seconds <= one.objective_seconds * (1 + 1e-9)  # groups=2 contains groups=1
    assert one.details.repeats == SolvedRepeats(start=1, period=10, count=6, groups=1)


def test_plan_and_costs_json_round_trip():
    problem = build([[1.0, 3.0], [3.0, None]], edges=[(0, 1, 10)])
    plan = solve_throughput(problem)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert CostTable.from_json(problem.costs.to_json()) == problem.costs
    with pytest.raises(UsageError, match="not a plan"):
        Plan.from_json('{"kernelfleet_plan": 1}')


def test_committed_fixture_replays_to_the_recorded_plan():
    program = Program.load(DATA / "layered2.program.json")
    costs = CostTable.from_json((DATA / "layered2.costs.json").read_text())
    devices = [Device("l40s"), Device("a100")]
    problem = Problem(program, devices, [Link("l40s", "a100", 100e9)], costs)
    recorded = Plan.from_json((DATA / "layered2.plan.json").read_text())
    plan = solve_throughput(problem)
    assert plan.objective_seconds == pytest.approx(recorded.objective_seconds, rel=1e-9)
    assert evaluate(problem, recorded).throughput_seconds == pytest.approx(recorded.objective_seconds, rel=1e-9)


def test_staged_policy_survives_a_grouped_solve_that_finds_nothing(monkeypatch):
    import kernelfleet.plan.policy as policy

    problem = random_dag(40, 3, seed=5)
    real = policy.solve_throughput

    def grouped_fails(problem, **kw):
        if kw.get("compress"):
            raise UsageError("the MILP found no placement within 1 s (Time limit reached)")
        return real(problem, **kw)

    monkeypatch.setattr(policy, "solve_throughput", grouped_fails)
    plan, plans, _ = throughput(problem, time_limit_seconds=5)
    check(problem, plan)
    best_start = min(p.details.throughput_seconds for p in plans if p.policy != "replicas")
    assert plan.details.throughput_seconds <= best_start + 1e-12


def test_staged_policy_returns_its_start_when_the_milp_finds_nothing(monkeypatch):
    import kernelfleet.plan.policy as policy

    problem = random_dag(40, 3, seed=6)

    def nothing(problem, **kw):
        raise UsageError("the MILP found no placement within 1 s (Time limit reached)")

    monkeypatch.setattr(policy, "solve_throughput", nothing)
    plan, plans, _ = throughput(problem, time_limit_seconds=5)
    check(problem, plan)
    assert "the start is returned" in plan.details.status
    assert plan.details.started_from != "grouped"


def test_replicas_of_a_pair_placement():
    from kernelfleet.plan.policy import group_replicas

    base = random_dag(60, 2, seed=11)
    a, b = base.names
    # four devices: two copies of the pair, same costs, every pair linked alike
    names = [a, b, a + "2", b + "2"]
    rows = [{**row, a + "2": row[a], b + "2": row[b]} for row in base.costs.seconds]
    bw = base.bandwidth[a, b]
    links = [Link(x, y, bw) for i, x in enumerate(names) for y in names[i + 1:]]
    problem = Problem(base.program, [Device(n) for n in names], links, CostTable(rows, "copied"))
    plan = group_replicas(problem, [[a, b], [a + "2", b + "2"]], time_limit_seconds=5)
    check(problem, plan)
    pair, _, _ = throughput(problem.restricted([a, b]), time_limit_seconds=5)
    # two identical groups serve twice the requests of one: half the time per request
    assert evaluate(problem, plan).throughput_seconds == pytest.approx(
        evaluate(problem.restricted([a, b]), pair).throughput_seconds / 2, rel=1e-9)
    assert [g.assignment for g in plan.details.groups][1] == [d + "2" for d in pair.assignment]
    # groups may not share a device
    bad = Plan("group-replicas", [], 0.0, details={"groups": [plan.details.groups[0]] * 2})
    assert any("shares devices" in v for v in violations(problem, bad))


def test_repeats_are_found_despite_measured_noise():
    problem = layered(6, 2)
    rng = random.Random(0)
    noisy = [{d: (v * (1 + 0.01 * rng.random()) if v is not None else None) for d, v in row.items()}
             for row in problem.costs.seconds]
    problem.costs = CostTable(noisy, "noisy")
    repeats = find_repeats(problem)
    assert repeats is not None and repeats.count == 6
