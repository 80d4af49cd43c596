"""Several slots (micro-batches) of a plan in one graph, as plain data, and its makespan.

Each slot is the plan's graph (``schedule.schedule``) over replicas of its own, so slots share no
bytes; what joins them is the devices and links they run on. :func:`pipeline` lays the slots out
as one list (a topological order, which the executor creates nodes in) with cross-slot
dependencies of one of three kinds:

* ``sequential``: each stream runs slot after slot (slot k+1's first node of a stream waits for
  slot k's last): a device starts slot k+1 once its part of slot k is done. A plan that switches
  devices every few kernels then gets no overlap at all — each slot is one chain through both
  devices — which is what two H200s measured (docs/place.md);
* ``free``: no dependency between slots. On the H200s the graph still ran each device's work in
  creation order, slot after slot: no better than sequential;
* ``scheduled``: each stream runs its nodes in the order a list scheduler picks them, given each
  node's estimated seconds: whenever a stream is free it takes, among the nodes whose dependencies
  have ended, the one of the earliest slot (so the pipeline fills in order, and a device switches
  to the next slot while the other device works on this one). The order becomes a chain per
  stream, so the graph runs it whatever the driver's own choice would be.

:func:`makespan` predicts the graph's time with each stream a single server taking its nodes in
list order, from per-node seconds; on the recorded plans it predicts the sequential measurements
within 4 % (llama8b decode: throughput plan 139.3 ms per slot vs 134.0 measured, layer pipeline
96.0 vs 95.6). :func:`per_request` predicts each slot mode with ``contention.predict``, which adds
what the devices do to each other where the cost table measured it (partitions sharing a GPU's
memory; free slots sharing a device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernelfleet.costs.links import find
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.plan.contention import Contention, predict, serial
from kernelfleet.plan.model import SLOT_MODES, Plan, Problem
from kernelfleet.plan.schedule import Node, schedule

MODES = SLOT_MODES
# how bench disagg and kernelfleet plan name a plan run in each mode ("pipeline, slots free")
SUFFIXES = {"sequential": "", "free": ", slots free", "scheduled": ", slots scheduled"}


@dataclass(frozen=True, slots=True)
class SlotNode:
    slot: int
    node: Node  # in its slot's own schedule (node.deps index that schedule)
    deps: tuple[int, ...]  # indices into the combined list


def pipeline(orders: list[list[Node]], mode: str = "sequential",
             seconds: Callable[[int, Node], float] | None = None) -> list[SlotNode]:
    """The slots' schedules as one list in the order nodes are created, with the cross-slot
    dependencies of ``mode`` (module docstring); ``seconds(slot, node)`` estimates a node's time,
    for ``scheduled``."""
    if mode not in MODES:
        raise UsageError(f"unknown slot mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "scheduled":
        if seconds is None:
            raise UsageError("scheduled slots need each node's estimated seconds (a cost table)")
        picked = _list_schedule(orders, seconds)
    else:
        picked = [(slot, n.index) for slot, order in enumerate(orders) for n in order]
    at = {key: k for k, key in enumerate(picked)}
    last: dict[str, int] = {}
    out = []
    for k, (slot, index) in enumerate(picked):
        n = orders[slot][index]
        deps = {at[slot, d] for d in n.deps}
        previous = last.get(n.stream)
        if mode != "free" and previous is not None and picked[previous][0] != slot:
            deps.add(previous)  # the stream's previous node is another slot's: wait for it
        last[n.stream] = k
        out.append(SlotNode(slot, n, tuple(sorted(deps))))
    return out


def _list_schedule(orders: list[list[Node]], seconds: Callable[[int, Node], float]) -> list[tuple[int, int]]:
    """(slot, node index) in the order a list scheduler starts them (module docstring): a
    topological order, since a node becomes ready only once its dependencies were picked."""
    waiting = {(s, n.index): len(n.deps) for s, order in enumerate(orders) for n in order}
    after: dict[tuple[int, int], list[tuple[int, int]]] = {}
    ready: dict[str, list[tuple[int, int, float]]] = {}  # stream -> (slot, index, ready time)
    for s, order in enumerate(orders):
        for n in order:
            for d in n.deps:
                after.setdefault((s, d), []).append((s, n.index))
            if not n.deps:
                ready.setdefault(n.stream, []).append((s, n.index, 0.0))
    free: dict[str, float] = {}
    end: dict[tuple[int, int], float] = {}
    picked: list[tuple[int, int]] = []
    while len(picked) < len(waiting):
        when, stream = min((max(free.get(st, 0.0), min(r[2] for r in nodes)), st)
                           for st, nodes in ready.items() if nodes)
        choice = min((r for r in ready[stream] if r[2] <= when), key=lambda r: (r[0], r[1]))
        ready[stream].remove(choice)
        s, i, _ = choice
        end[s, i] = free[stream] = when + seconds(s, orders[s][i])
        picked.append((s, i))
        for m in after.get((s, i), []):
            waiting[m] -= 1
            if waiting[m] == 0:
                node = orders[m[0]][m[1]]
                ready.setdefault(node.stream, []).append((m[0], m[1], max(end[m[0], d] for d in node.deps)))
    return picked


def makespan(combined: list[SlotNode], seconds: Callable[[SlotNode], float]) -> float:
    """Seconds from start to the last node's end, each node starting once its dependencies have
    ended and its stream has finished the nodes before it in the list (``contention.serial``)."""
    return max((end for _, end in serial(combined, [seconds(x) for x in combined])), default=0.0)


def uniform_link(copy_us: float, gbps: float) -> Callable[[int, str, str], float]:
    """Every copy between any two devices: ``copy_us`` microseconds plus its bytes at ``gbps`` GB/s
    (what ``kernelfleet plan --copy-us --link-gbps`` plans with)."""
    def transfer(nbytes: int, src: str, dst: str) -> float:
        return copy_us * 1e-6 + nbytes / (gbps * 1e9)

    return transfer


def estimate(costs: CostTable, transfer_seconds: Callable[[int, str, str], float]) -> Callable[[int, Node], float]:
    """``seconds(slot, node)`` from a cost table (a launch's seconds on its device) and a link
    model ``transfer_seconds(bytes, src, dst)``, which the table's measured link of a pair
    (``CostTable.links``: a copy between kernels) replaces."""
    def seconds(slot: int, n: Node) -> float:
        if n.launch is None:
            link = find(costs.links, n.copy.src, n.copy.dst)
            if link is not None:
                return link.between.copy_seconds(n.copy.length_bytes)
            return transfer_seconds(n.copy.length_bytes, n.copy.src, n.copy.dst)
        value = costs.seconds[n.launch].get(n.devices[0])
        if value is None:
            raise UsageError(f"the cost table has no time for launch {n.launch} on {n.devices[0]}")
        return value

    return seconds


def per_request(problem: Problem, plan: Plan, slots: int) -> float | None:
    """Predicted seconds per request with ``slots`` requests in flight, as the executor would run
    the plan in its fastest slot mode (:func:`per_request_modes`); None for a plan of another shape."""
    modes = per_request_modes(problem, plan, slots)
    return min(modes.values()) if modes else None


def fastest_mode(problem: Problem, plan: Plan, slots: int) -> str | None:
    """The slot mode :func:`per_request_modes` predicts fastest (the first of a tie); None for a plan
    of another shape."""
    modes = per_request_modes(problem, plan, slots)
    return min(modes, key=modes.get) if modes else None


def per_request_modes(problem: Problem, plan: Plan, slots: int) -> dict[str, float]:
    """Predicted seconds per request with ``slots`` requests in flight in each slot mode of
    :data:`MODES` (one slot: ``sequential`` only, the modes being the same), as the executor would
    run the plan: resident state, the problem's costs and links, ``contention.predict`` (with the
    problem's ``edge_fit`` where it has one). Request
    distribution (a plan without an assignment, naming its ``replicas``) runs each request whole on
    the device that would finish it first. Empty for a plan of another shape."""
    if slots < 1:
        raise UsageError(f"requests in flight must be at least 1, got {slots}")
    program, overlap = problem.program, not problem.program.units
    if plan.assignment:
        home = plan.details.home or problem.home
        orders = [schedule(program, plan.assignment, home, overlap=overlap, resident_state=True)] * slots
    elif plan.details.replicas:
        devices = plan.details.replicas
        whole = {d: sum(problem.cost(k, d) or 0.0 for k in range(len(program.launches))) for d in devices}
        busy = dict.fromkeys(devices, 0.0)
        split = []
        for _ in range(slots):
            d = min(devices, key=lambda x: busy[x] + whole[x])
            busy[d] += whole[d]
            split.append(d)
        alone = {d: schedule(program, [d] * len(program.launches), d, overlap=overlap, resident_state=True)
                 for d in set(split)}
        orders = [alone[d] for d in split]
    else:
        return {}
    seconds = estimate(problem.costs, problem.transfer_seconds)
    contention = Contention.of(problem.costs, problem.edge_fit)
    return {mode: predict(pipeline(orders, mode, seconds), lambda x: seconds(x.slot, x.node), contention, mode) / slots
            for mode in (MODES if slots > 1 else MODES[:1])}
