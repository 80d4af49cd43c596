"""The entry points: every plan for a problem, and the throughput plan started from the best baseline."""

from __future__ import annotations

from kernelfleet.plan.baselines import baselines
from kernelfleet.plan.milp import solve_throughput
from kernelfleet.plan.model import Plan, Problem
from kernelfleet.plan.validate import evaluate, violations


def throughput(problem: Problem, *, time_limit_seconds: float = 30.0, mip_rel_gap: float = 1e-4,
               compress: bool = False, groups: int = 1) -> tuple[Plan, list[Plan], dict[str, str]]:
    """The MILP plan (started from the best kernel-placement baseline on the home device, so
    it is never worse than that one even when the time limit stops the search), the valid
    baselines, and why any baseline was skipped. Objectives are the validator's."""
    plans, skipped = baselines(problem)
    # any baseline that is also a valid plan on the problem's home is a MILP solution to start from
    starts = [p for p in plans if p.policy != "replicas" and not violations(
        problem, Plan(p.policy, p.assignment, 0.0, details={"home": problem.home}))]
    best = min(starts, key=lambda p: p.details["throughput_seconds"], default=None)
    plan = solve_throughput(problem, time_limit_seconds=time_limit_seconds, mip_rel_gap=mip_rel_gap,
                            compress=compress, groups=groups, start=None if best is None else best.assignment)
    ev = evaluate(problem, plan)
    plan.details.update(throughput_seconds=ev.throughput_seconds, latency_seconds=ev.latency_seconds,
                        started_from=None if best is None else best.policy)
    return plan, plans, skipped
