"""The entry points: every plan for a problem, and the throughput plan started from the best baseline."""

from __future__ import annotations

import time

from kernelfleet.errors import UsageError
from kernelfleet.plan.baselines import baselines
from kernelfleet.plan.milp import solve_throughput, zero_comm_bound
from kernelfleet.plan.model import Plan, Problem
from kernelfleet.plan.validate import evaluate, violations


def throughput(problem: Problem, *, time_limit_seconds: float = 30.0, mip_rel_gap: float = 1e-4,
               compress: bool = False, groups: int = 1, staged: bool = True) -> tuple[Plan, list[Plan], dict[str, str]]:
    """The MILP plan, the valid baselines, and why any baseline was skipped.

    The MILP starts from the best of the kernel-placement baselines on the home device and,
    when ``staged`` (and not ``compress``), of a quick grouped solve (repeated layers in as
    many runs as there are devices, a quarter of the time limit): so it is never worse than
    either even when the time limit stops the search. Objectives are the validator's."""
    began = time.perf_counter()
    plans, skipped = baselines(problem)
    # any baseline that is also a valid plan on the problem's home is a MILP solution to start from
    starts = [(p.details["throughput_seconds"], p.policy, p.assignment) for p in plans if p.policy != "replicas"
              and not violations(problem, Plan(p.policy, p.assignment, 0.0, details={"home": problem.home}))]
    limit = time_limit_seconds
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
    plan.details.update(throughput_seconds=ev.throughput_seconds, latency_seconds=ev.latency_seconds,
                        started_from=None if best is None else best[1], solve_seconds=time.perf_counter() - began)
    return plan, plans, skipped


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
    plan.details.update(throughput_seconds=ev.throughput_seconds, latency_seconds=ev.latency_seconds)
    return plan
