"""Check and evaluate a plan, independently of any planner.

The runtime trusts only plans that pass :func:`check` (STYLE: torchtitan validates a plan as
plain data before anything touches a device). Nothing here imports the planners or uses
their aggregated edges: the throughput time is recomputed from the raw RAW edges, and the
latency by an event-driven list schedule, so a test that compares a planner's reported
objective with :func:`evaluate` compares two separate implementations of the cost model
described in ``model.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelfleet.errors import UsageError
from kernelfleet.plan.model import Plan, Problem


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A plan's figures under the shared cost model (seconds)."""

    throughput_seconds: float  # time per request in steady state (the busiest device's time)
    latency_seconds: float  # one request alone
    busy_seconds: dict[str, float]  # per device: compute + transfers sent/received, per request
    transfer_seconds: dict[str, float]  # the transfer part of busy_seconds
    memory_bytes: dict[str, int]


def violations(problem: Problem, plan: Plan) -> list[str]:
    """Everything wrong with the plan, one line each; empty when it is valid."""
    if plan.policy == "replicas":
        return _replica_violations(problem, plan)
    if plan.policy == "group-replicas":
        return _group_violations(problem, plan)
    names = set(problem.names)
    launches = problem.program.launches
    out: list[str] = []
    if len(plan.assignment) != len(launches):
        return [(f"plan assigns {len(plan.assignment)} launches, program has {len(launches)} "
                 "(each launch exactly once): it was made for another program")]
    home = plan.details.home or problem.home
    if home not in names:
        out.append(f"plan home {home!r} is not a known device")
    unknown: set[str] = set()
    for k, device in enumerate(plan.assignment):
        if device not in names:
            if device not in unknown:  # one line per device: a plan for another pair misplaces every launch
                unknown.add(device)
                out.append(f"launch {k} uses {device}, an unknown device (devices: {', '.join(problem.names)})")
            continue
        if not problem.runs(k, device):
            out.append(f"launch {k} assigned to {device}, which has no cost for it (cannot run it)")
        if launches[k].pinned and device != home:
            out.append(f"launch {k} is pinned ({launches[k].pinned}) but placed on {device}, not home {home}")
    for group in problem.groups:
        split = sorted({plan.assignment[k] for k in group})
        if len(split) > 1:
            out.append(f"launches {group[0]}-{group[-1]} ({launches[group[0]].op}) pass data through their op "
                       f"call's own workspace, so they run on one device; the plan puts them on {', '.join(split)}")
    if out:
        return out
    for device, used in _memory(problem, plan.assignment).items():
        limit = problem.devices[problem.names.index(device)].memory_bytes
        if limit is not None and used > limit:
            out.append(f"device {device} needs {used} bytes, limit {limit}")
    return out


def check(problem: Problem, plan: Plan) -> None:
    """Raise UsageError naming the first violation (and how many there are)."""
    found = violations(problem, plan)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(f"invalid {plan.policy} plan: {found[0]}{more}")


def evaluate(problem: Problem, plan: Plan) -> Evaluation:
    """The plan's throughput time, latency, per-device busy time and memory. Checks it first."""
    check(problem, plan)
    if plan.policy == "replicas":
        return _evaluate_replicas(problem, plan)
    if plan.policy == "group-replicas":
        return _evaluate_groups(problem, _groups(plan))
    busy = {d: 0.0 for d in problem.names}
    transfer = {d: 0.0 for d in problem.names}
    for k, device in enumerate(plan.assignment):
        busy[device] += problem.costs.seconds[k][device] or 0.0
    for e in problem.edges:
        a, b = plan.assignment[e.src], plan.assignment[e.dst]
        if a != b:
            seconds = problem.transfer_seconds(e.bytes, a, b)
            for end in (a, b):
                transfer[end] += seconds
                busy[end] += seconds
    return Evaluation(max(busy.values()), latency(problem, plan.assignment), busy, transfer,
                      _memory(problem, plan.assignment))


@dataclass(frozen=True, slots=True)
class Transfer:
    """A cut edge's bytes (summed over its buffers) moving for one request (seconds)."""

    src: int  # the producing launch
    dst: int  # the consuming launch
    source: str  # device sending
    target: str  # device receiving
    nbytes: int
    start_seconds: float
    end_seconds: float


@dataclass(frozen=True, slots=True)
class Schedule:
    """One request's list schedule: when each launch runs (capture order) and each transfer."""

    device: list[str]
    start_seconds: list[float]
    end_seconds: list[float]
    transfers: list[Transfer]

    @property
    def makespan_seconds(self) -> float:
        return max(self.end_seconds, default=0.0)


def latency(problem: Problem, assignment: list[str]) -> float:
    """One request's makespan under :func:`schedule`."""
    return schedule(problem, assignment).makespan_seconds


def schedule(problem: Problem, assignment: list[str]) -> Schedule:
    """One request alone: each device runs its launches in capture order; a launch starts
    when its device is free and every RAW predecessor has finished (plus the transfer, when
    the predecessor ran elsewhere). Transfers are not serialised against each other, except in
    a program of units (``Program.units``), whose executor stalls both devices of a copy: a
    transfer starts when both are free, and neither runs anything until it has arrived."""
    preds: dict[int, list[tuple[int, int]]] = {}
    for e in problem.edges:
        preds.setdefault(e.dst, []).append((e.src, e.bytes))
    free = {d: 0.0 for d in problem.names}
    start: list[float] = []
    finish: list[float] = []
    transfers: list[Transfer] = []
    for k, device in enumerate(assignment):
        ready = free[device]
        # bytes from one producer over several buffers travel as one transfer of their sum
        incoming: dict[int, int] = {}
        for src, nbytes in preds.get(k, ()):
            incoming[src] = incoming.get(src, 0) + nbytes
        for src, nbytes in incoming.items():
            there = assignment[src]
            begin = finish[src]
            if there != device and problem.program.units:
                begin = max(begin, free[there], free[device])
            arrive = begin + problem.transfer_seconds(nbytes, there, device)
            if there != device:
                transfers.append(Transfer(src, k, there, device, nbytes, begin, arrive))
                if problem.program.units:
                    free[there] = free[device] = arrive
            ready = max(ready, arrive)
        start.append(ready)
        finish.append(ready + (problem.costs.seconds[k][device] or 0.0))
        free[device] = finish[-1]
    return Schedule(list(assignment), start, finish, transfers)


def _memory(problem: Problem, assignment: list[str]) -> dict[str, int]:
    held: dict[str, set[int]] = {d: set() for d in problem.names}
    for launch, device in zip(problem.program.launches, assignment):
        held[device].update(a.buffer for a in launch.accesses)
    sizes = {b.id: b.size_bytes for b in problem.program.buffers}
    return {d: sum(sizes[b] for b in ids) for d, ids in held.items()}


def _replica_violations(problem: Problem, plan: Plan) -> list[str]:
    replicas = plan.details.replicas
    if not replicas:
        return ["a replicas plan lists its devices in details.replicas"]
    out = [f"replica on unknown device {d!r}" for d in replicas if d not in problem.names]
    if len(set(replicas)) != len(replicas):
        out.append(f"a device holds two replicas: {replicas}")
    for d in (d for d in replicas if d in problem.names):
        missing = [k for k in range(len(problem.program.launches)) if problem.costs.seconds[k].get(d) is None]
        if missing:
            out.append(f"replica on {d} cannot run launch {missing[0]} (no cost)")
            continue
        used = _memory(problem, [d] * len(problem.program.launches))[d]
        limit = problem.devices[problem.names.index(d)].memory_bytes
        if limit is not None and used > limit:
            out.append(f"replica on {d} needs {used} bytes, limit {limit}")
    return out


def _evaluate_replicas(problem: Problem, plan: Plan) -> Evaluation:
    """Each device runs whole requests: replicas of a one-device group each (``_evaluate_groups``)."""
    n = len(problem.program.launches)
    return _evaluate_groups(problem, [Plan("group", [d] * n, 0.0, details={"home": d})
                                      for d in plan.details.replicas or ()])


def _groups(plan: Plan) -> list[Plan]:
    """A group-replicas plan's groups, each a placement of whole requests on its own devices."""
    return [Plan("group", list(g.assignment), 0.0, details={"home": g.home}) for g in plan.details.groups or ()]


def _group_violations(problem: Problem, plan: Plan) -> list[str]:
    if not plan.details.groups:
        return ["a group-replicas plan lists details.groups as {assignment, home} placements"]
    out, used = [], set()
    for i, group in enumerate(_groups(plan)):
        mine = set(group.assignment) | {group.details.home}
        if mine & used:
            out.append(f"group {i} shares devices {sorted(mine & used)} with another group")
        used |= mine
        out += [f"group {i}: {v}" for v in violations(problem, group)]
    return out


def _evaluate_groups(problem: Problem, groups: list[Plan]) -> Evaluation:
    """Each group serves whole requests with its own placement; the load is split by speed, so the
    fleet serves sum(1 / T_g) requests per second and the time per request is 1 / sum(1 / T_g); a
    device is busy its group's time scaled by the group's share of requests. No transfers between
    groups. Latency is that of the fastest group (an idle fleet routes there)."""
    each = [evaluate(problem, g) for g in groups]
    rate = sum(1.0 / e.throughput_seconds if e.throughput_seconds > 0 else float("inf") for e in each)
    busy = {d: 0.0 for d in problem.names}
    transfer = {d: 0.0 for d in problem.names}
    memory = {d: 0 for d in problem.names}
    for e in each:
        share = (1.0 / e.throughput_seconds) / rate if e.throughput_seconds > 0 else 0.0
        for d in problem.names:
            busy[d] += share * e.busy_seconds[d]
            transfer[d] += share * e.transfer_seconds[d]
            memory[d] = max(memory[d], e.memory_bytes.get(d, 0))
    return Evaluation(1.0 / rate if rate > 0 else 0.0, min(e.latency_seconds for e in each), busy, transfer, memory)
