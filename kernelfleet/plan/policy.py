"""The entry points: every plan for a problem, and the throughput plan started from the best baseline.

With ``in_flight=K`` the throughput plan is the one predicted fastest per request with K requests
in flight, as the executor runs them (``plan/slots.per_request``: the fastest slot mode, each
predicted with what the devices do to each other, ``plan/contention.py``). The
MILP's objective, the busiest device's time, is the limit with unboundedly many requests in flight;
with a few, a plan that switches devices every few kernels makes each request one serial chain
through both devices (docs/place.md, the disaggregation benchmark). So the policy solves the MILP
under a ladder of switch budgets (``milp.py``: S device changes along the launch order at most)
as well as without one, and keeps whichever plan, baselines included, ``per_request`` predicts
fastest at K.
"""

from __future__ import annotations

import time
from dataclasses import replace

from kernelfleet.errors import UsageError
from kernelfleet.plan.baselines import baselines
from kernelfleet.plan.milp import solve_throughput, switches, zero_comm_bound
from kernelfleet.plan.model import Candidate, InFlight, Plan, Problem
from kernelfleet.plan.slots import per_request
from kernelfleet.plan.validate import evaluate, violations

LADDER = (1, 2, 4, 8, 16)  # switch budgets tried with requests in flight
LADDER_SHARE = 0.5  # of the time limit, for the budgeted solves; the unconstrained solve gets the rest


def throughput(problem: Problem, *, time_limit_seconds: float = 30.0, mip_rel_gap: float = 1e-4,
               compress: bool = False, groups: int = 1, staged: bool = True, in_flight: int | None = None,
               ladder: tuple[int, ...] = LADDER) -> tuple[Plan, list[Plan], dict[str, str]]:
    """The MILP plan, the valid baselines, and why any baseline was skipped.

    The MILP starts from the best of the kernel-placement baselines on the home device and,
    when ``staged`` (and not ``compress``), of a quick grouped solve (repeated layers in as
    many runs as there are devices, a quarter of the time limit): so it is never worse than
    either even when the time limit stops the search. Objectives are the validator's.

    ``in_flight=K``: the plan predicted fastest per request with K requests in flight among the
    MILP under each switch budget of ``ladder``, the MILP without one and the baselines that place
    every launch (module docstring); its objective is that prediction and ``details.in_flight``
    records every candidate's. The time limit covers all the solves."""
    began = time.perf_counter()
    plans, skipped = baselines(problem)
    if in_flight is None:
        plan = _staged(problem, plans, time_limit_seconds, mip_rel_gap, compress, groups, staged, [])
        plan.details.solve_seconds = time.perf_counter() - began
        return plan, plans, skipped
    if in_flight < 1:
        raise UsageError(f"requests in flight must be at least 1, got {in_flight}")
    return _in_flight(problem, plans, in_flight, began, time_limit_seconds, mip_rel_gap, compress, groups, staged,
                      ladder), plans, skipped


def _starts(problem: Problem, plans: list[Plan]) -> list[tuple[float, str, list[str]]]:
    """(throughput seconds, name, assignment) of every plan that is also a valid plan on the problem's home."""
    return [(p.objective_seconds if p.details.throughput_seconds is None else p.details.throughput_seconds, p.policy,
             p.assignment) for p in plans
            if p.assignment and not violations(problem, Plan(p.policy, p.assignment, 0.0,
                                                             details={"home": problem.home}))]


def _staged(problem: Problem, plans: list[Plan], limit: float, mip_rel_gap: float, compress: bool, groups: int,
            staged: bool, more: list[Plan]) -> Plan:
    """The MILP without a switch budget, started from the best of ``plans`` (baselines), ``more``
    and, when ``staged``, a quick grouped solve."""
    # any baseline that is also a valid plan on the problem's home is a MILP solution to start from
    starts = _starts(problem, [p for p in plans if p.policy != "replicas"] + more)
    if staged and not compress and len(problem.devices) > 1:
        quick_began = time.perf_counter()
        try:
            quick = solve_throughput(problem, time_limit_seconds=limit / 4, mip_rel_gap=mip_rel_gap, compress=True,
                                     groups=len(problem.devices))
            if not violations(problem, quick):
                starts.append((evaluate(problem, quick).throughput_seconds, "grouped", quick.assignment))
        except UsageError:
            if not starts:  # nothing else to start from: the grouped solve's failure is the answer
                raise
            # the grouped solve found nothing in its share of the time (8+ devices): the baselines start
        limit -= time.perf_counter() - quick_began
    best = min(starts, default=None)
    try:
        plan = solve_throughput(problem, time_limit_seconds=max(0.5, limit), mip_rel_gap=mip_rel_gap,
                                compress=compress, groups=groups, start=None if best is None else best[2])
    except UsageError as exc:
        if best is None or "no placement satisfies" in str(exc):
            raise
        # 16 devices x 2,000 launches: the MILP did not get past its relaxation in time. The start
        # is a valid placement; say so rather than pretend it was optimised.
        plan = Plan("throughput-milp", list(best[2]), best[0], zero_comm_bound(problem)["lp"],
                    details={"home": problem.home, "status": f"no MILP solution in time ({exc}); the start is "
                             "returned", "mip_gap": None})
    ev = evaluate(problem, plan)
    plan.details.throughput_seconds, plan.details.latency_seconds = ev.throughput_seconds, ev.latency_seconds
    plan.details.started_from = None if best is None else best[1]
    return plan


def _in_flight(problem: Problem, plans: list[Plan], requests: int, began: float, limit: float, mip_rel_gap: float,
               compress: bool, groups: int, staged: bool, ladder: tuple[int, ...]) -> Plan:
    """The candidate placement predicted fastest per request with ``requests`` in flight."""
    candidates: list[tuple[float, int, dict, Plan]] = []  # (per request, tie-break, its row, plan)
    rows: list[dict] = []  # every candidate's figures, replicas' and failed solves' too

    def consider(name: str, plan: Plan, budget: int | None = None, seconds: float | None = None) -> None:
        if plan.details.throughput_seconds is None:
            plan.details.throughput_seconds = evaluate(problem, plan).throughput_seconds
        row = {"plan": name, "per_request_seconds": per_request(problem, plan, requests),
               "throughput_seconds": plan.details.throughput_seconds,
               "switches": switches(problem, plan.assignment, plan.details.home) if plan.assignment else None}
        if seconds is not None:
            row.update(max_switches=budget, solve_seconds=seconds, status=plan.details.status)
        rows.append(row)
        if plan.assignment:
            candidates.append((row["per_request_seconds"], len(candidates), row, plan))

    for plan in plans:
        consider(plan.policy, plan)
    free = sum(len(problem.allowed(k)) > 1 for k in range(len(problem.program.launches)))
    budgets = sorted({s for s in ladder if 0 <= s < free - 1})  # free - 1 switches: no budget at all
    solved: list[Plan] = []
    if 1 in budgets:
        cut_began = time.perf_counter()
        cut = best_cut(problem)
        if cut is not None:  # the one-switch MILP's optimum, found in a fraction of a second
            cut.details.status, cut.details.max_switches = "every cut enumerated (exact)", 1
            solved.append(cut)
            consider("at most 1 switch", cut, 1, time.perf_counter() - cut_began)
            budgets.remove(1)
    for i, budget in enumerate(budgets):
        name = f"at most {budget} switch{'es' if budget != 1 else ''}"
        left = LADDER_SHARE * limit - (time.perf_counter() - began)
        share = max(0.5, left / (len(budgets) - i))  # what an earlier solve left unused goes to the later ones
        # the best plan known within the budget starts the solve; smaller budgets' plans all are
        within = [s for s in _starts(problem, [c[3] for c in candidates])
                  if switches(problem, s[2]) <= budget]
        solve_began = time.perf_counter()
        try:
            plan = solve_throughput(problem, time_limit_seconds=share, mip_rel_gap=mip_rel_gap, compress=compress,
                                    groups=groups, start=min(within)[2] if within else None, max_switches=budget)
        except UsageError as exc:
            rows.append({"plan": name, "max_switches": budget, "status": str(exc)})
            continue
        solved.append(plan)
        consider(name, plan, budget, time.perf_counter() - solve_began)
    solve_began = time.perf_counter()
    unbounded = _staged(problem, plans, max(0.5, limit - (time.perf_counter() - began)), mip_rel_gap, compress, groups,
                        staged, solved)
    consider("no switch budget", unbounded, None, time.perf_counter() - solve_began)

    _, _, mine, best = min(candidates, key=lambda c: c[:2])
    replicas = next((r for r in rows if r["plan"] == "replicas"), None)
    ev = evaluate(problem, best)
    faster = replicas is not None and replicas["per_request_seconds"] < mine["per_request_seconds"]
    flight = InFlight(
        requests=requests, chosen=mine["plan"], max_switches=mine.get("max_switches"), switches=mine["switches"],
        per_request_seconds=mine["per_request_seconds"],
        objective=f"seconds per request with {requests} in flight, in the fastest slot mode (plan/slots.py)",
        replicas_faster=faster, candidates=[Candidate(**row) for row in rows],
        note=(f"request distribution (replicas) is predicted faster with {requests} in flight "
              f"({replicas['per_request_seconds']:.6f} s per request against {mine['per_request_seconds']:.6f} s): "
              "run replicas; this plan is the best placement of one request over the devices") if faster else None)
    details = replace(best.details, home=best.details.home or problem.home, throughput_seconds=ev.throughput_seconds,
                      latency_seconds=ev.latency_seconds, solve_seconds=time.perf_counter() - began, in_flight=flight)
    # per request with K in flight >= the busiest device's compute: the zero-communication bound holds,
    # the MILP's own bounds (transfers charged to compute) need not
    bound = best.details.zero_comm_lp_seconds
    if bound is None:  # not from the MILP
        bound = best.lower_bound_seconds if best.lower_bound_seconds is not None else zero_comm_bound(problem)["lp"]
    return Plan("throughput-milp", list(best.assignment), mine["per_request_seconds"], bound, details)


def best_cut(problem: Problem, tries: int = 20) -> Plan | None:
    """On two devices, the best plan with at most one switch (``milp.py``'s budget): the free
    launches up to a cut on one device, the rest on the other, every cut and both orders
    enumerated in O(launches + edges) under the MILP's objective (compute plus cut transfers,
    charged to both ends). The MILP's optimum under ``max_switches=1`` whenever one of the
    ``tries`` best cuts meets the memory limits; None otherwise, or on other than two devices."""
    if len(problem.names) != 2:
        return None
    n = len(problem.program.launches)
    seconds = 1.0 / problem.bandwidth[problem.names[0], problem.names[1]]
    edges = problem.edge_bytes()
    around: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # launch -> (other end, bytes)
    for (i, j), nbytes in edges.items():
        if i != j and nbytes > 0:
            around[i].append((j, nbytes))
            around[j].append((i, nbytes))
    free = [k for k in range(n) if len(problem.allowed(k)) > 1]
    found: list[tuple[float, int, str]] = []  # (busiest device's time, cut, first device)
    for first, second in (problem.names, problem.names[::-1]):
        at = [second if len(problem.allowed(k)) > 1 else problem.allowed(k)[0] for k in range(n)]
        busy = {d: sum(problem.cost(k, d) or 0.0 for k in range(n) if at[k] == d) for d in problem.names}
        cut = sum(b for (i, j), b in edges.items() if at[i] != at[j]) * seconds
        found.append((max(busy.values()) + cut, 0, first))
        for c, k in enumerate(free, start=1):  # launch k moves to the first device
            for other, nbytes in around[k]:
                cut += nbytes * seconds * ((at[other] == second) - (at[other] == first))
            busy[second] -= problem.cost(k, second) or 0.0
            busy[first] += problem.cost(k, first) or 0.0
            at[k] = first
            found.append((max(busy.values()) + cut, c, first))
    position = {k: i for i, k in enumerate(free)}
    inside = set()  # cuts that would split a group (Problem.groups) kept on one device
    for group in problem.groups:
        at = [position[k] for k in group if k in position]
        inside.update(range(min(at) + 1, max(at) + 1) if at else ())
    for _, c, first in sorted(x for x in found if x[1] not in inside)[:tries]:
        second = problem.names[1] if first == problem.names[0] else problem.names[0]
        assignment = [problem.allowed(k)[0] for k in range(n)]
        for i, k in enumerate(free):
            assignment[k] = first if i < c else second
        plan = Plan("best-cut", assignment, 0.0, details={"home": problem.home})
        if not violations(problem, plan):
            plan.objective_seconds = evaluate(problem, plan).throughput_seconds
            return plan
    return None


def group_replicas(problem: Problem, groups: list[list[str]], *, time_limit_seconds: float = 30.0) -> Plan:
    """Replicas of a placement: each group of devices (a complementary pair, say) serves whole
    requests with the throughput plan of its own sub-problem; requests are split by speed. Groups
    whose devices have the same costs and links, position by position, share one solve."""
    names = set(problem.names)
    for g in groups:
        unknown = [d for d in g if d not in names]
        if unknown or not g:
            raise UsageError(f"group {g}: unknown devices {unknown}" if unknown else "an empty group")
    solved: dict[tuple, list[int]] = {}  # signature -> assignment as positions in the group
    out = []
    for g in groups:
        key = tuple(tuple(row.get(d) for d in g) for row in problem.costs.seconds) + tuple(
            problem.bandwidth[a, b] for a in g for b in g if a != b)
        if key not in solved:
            sub = problem.restricted(g)
            plan, _, _ = throughput(sub, time_limit_seconds=time_limit_seconds)
            solved[key] = [g.index(d) for d in plan.assignment]
        out.append({"assignment": [g[i] for i in solved[key]], "home": g[0]})
    plan = Plan("group-replicas", [], 0.0, zero_comm_bound(problem)["lp"], details={"groups": out})
    ev = evaluate(problem, plan)
    plan.objective_seconds = ev.throughput_seconds
    plan.details.throughput_seconds, plan.details.latency_seconds = ev.throughput_seconds, ev.latency_seconds
    return plan
