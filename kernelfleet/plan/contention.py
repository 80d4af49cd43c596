"""The time of a graph of several slots, with what its devices do to each other: the one prediction
``kernelfleet plan``, ``bench disagg`` and the placement table share.

:func:`slots.makespan` treats each device as a server that runs its nodes one after another at the
speed each node was timed alone. Two measurements of ``kernelfleet profile`` (``CostTable``:
``graph_seconds_shared``, ``graph_seconds_free``) correct the two ways that is wrong on one GPU:

* **Contention.** Two partitions of one H200 busy at once share its memory and L2: request
  distribution ran 11-18 % slower than each device's graph alone predicts (2026-12-01,
  docs/validation/place-h200-pairs.md). A node runs slower by its device's shared factor (its graph
  timed while the other devices loop theirs, over alone) for the share of its time some other device
  computes too: a first pass schedules with the times alone, and each node is stretched by
  ``1 + overlap × (shared - 1)``; a second pass schedules with the stretched times. So a single
  device keeps its time alone, replicas (both busy throughout) get the shared factor, and a plan
  whose devices take turns gets little of it. Where profile also timed the two devices' graphs
  launched together once (``graph_seconds_together``: request distribution's own graph), the
  factors are scaled so that this model predicts that measurement (``CostTable.contention_factors``):
  looping the other graph overstated what the devices meet by about half on the H100.
* **Slots free.** With no dependency between slots the GPU runs kernels of several slots at once
  on one device, which helps steps of kernels too small to fill it (moe-decode's throughput plan ran
  386 µs for two free slots against 680 chained). Free slots are predicted by processor sharing:
  the compute nodes in flight on a device share it, ``k`` of them doing ``g(k)`` times the work per
  second of one, where ``g(copies)`` is the measured free speedup (the graph's ``copies`` chains
  free over chained), ``g(1) = 1``, linear between and flat beyond (more than ``copies`` at once was
  not measured, so no more gain is assumed). Copies run at their own speed, one at a time on their
link stream as the executor queues them, whichever slot they belong to: on the H200 run of
2026-12-01 (disjoint partitions) free slots with 16-47 copies each ran 1.7-1.9x slower than a
model of copies in parallel predicted (dit-denoise's throughput plan: 135.9 µs a slot against
72.9). Where
  the free speedup was not measured, free slots are predicted as before: each device takes its
  nodes in creation order (what two H200s measured, docs/place.md).

Chained and scheduled slots run one node at a time per device: their prediction is the makespan,
with the contention pass where the shared factor was measured.

**Waits and forks across devices.** Where the cost table holds a measured link
(``CostTable.links``, ``costs/links.py``), in every slot mode: a node that waits for a node of
another stream (a copy for the kernel that wrote its bytes, a kernel for the copy that brought
them) starts that link's ``wait_seconds`` after it ended; and a node that another stream waits for
(a kernel whose bytes a copy takes) holds its own stream's next node ``fork_seconds`` longer. In a
graph a dependency between two devices' nodes is not free, and a plan of many copies pays both
per copy. Without a measured link both cost nothing, as before.

**Edges fitted in a real step.** Where a fit of per-edge costs is given (``Contention.edges``,
``plan/edges.py``: fitted by ``python -m bench.place_table --edges`` on the residuals of
``python -m bench.edge_cost``'s plans), the prediction is the makespan plus what the fit charges
the graph's counts (its copies on the predicted critical chain, its waits and forks across
streams): the same linear correction the fit was made with, so fit and use agree. Without a fit
(``Contention.of(costs)``) every prediction stays what it was.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelfleet.costs.table import CostTable
from kernelfleet.plan.edges import EdgeFit, counts

if TYPE_CHECKING:  # slots.py imports this module to predict
    from kernelfleet.plan.slots import SlotNode

COPIES = 2  # chains in the free graph profile times (profile/steptime.py): g is known at 1 and at this


@dataclass(frozen=True)
class Contention:
    """Per device, the shared factor (>= 1 but for noise) and the free speedup; a device missing
    from either was not measured that way (treated as 1: no contention, no gain)."""

    shared: dict[str, float] = field(default_factory=dict)
    free: dict[str, float] = field(default_factory=dict)
    copies: int = COPIES
    # pair of devices -> seconds (module docstring): a wait across streams, a fork to another stream
    waits: dict[frozenset[str], float] = field(default_factory=dict)
    forks: dict[frozenset[str], float] = field(default_factory=dict)
    edges: EdgeFit | None = None  # per-edge costs fitted in a real step (module docstring); None: none

    @classmethod
    def of(cls, costs: CostTable | None, edges: EdgeFit | None = None) -> Contention:
        if costs is None:
            return cls(edges=edges)
        links = {frozenset((link.a, link.b)): link for link in costs.links or ()}
        return cls(costs.contention_factors(), costs.free_speedups(),
                   waits={k: x.wait_seconds for k, x in links.items()},
                   forks={k: x.fork_seconds for k, x in links.items()}, edges=edges)

    def wait(self, x: SlotNode, dep: SlotNode) -> float:
        """What ``x`` waits after its dependency ``dep`` ended: the measured wait of the devices'
        link when they run on two streams, else nothing."""
        if not self.waits or x.node.stream == dep.node.stream:
            return 0.0
        return self.waits.get(frozenset(x.node.devices + dep.node.devices), 0.0)

    def held(self, combined: list[SlotNode]) -> list[float]:
        """Per node, how much longer it holds its stream because another stream waits for it: the
        largest measured fork of the links to its dependents on other streams (0: none)."""
        out = [0.0] * len(combined)
        if self.forks:
            for x in combined:
                for d in x.deps:
                    dep = combined[d]
                    if dep.node.stream != x.node.stream:
                        out[d] = max(out[d], self.forks.get(frozenset(x.node.devices + dep.node.devices), 0.0))
        return out

    def gain(self, device: str, k: int) -> float:
        """Work per second of ``k`` compute nodes in flight on ``device``, over one's (module docstring)."""
        top = self.free.get(device, 1.0)
        if k <= 1:
            return float(k)
        return top if k >= self.copies else 1 + (k - 1) * (top - 1) / (self.copies - 1)


def predict(combined: list[SlotNode], seconds: Callable[[SlotNode], float], contention: Contention,
            mode: str) -> float:
    """Seconds of the graph ``combined`` (``slots.pipeline`` in ``mode``), each node taking
    ``seconds(node)`` alone, under ``contention`` (module docstring)."""
    found = spans(combined, seconds, contention, mode)
    end = max((end for _, end in found), default=0.0)
    if contention.edges is None:
        return end
    return end + contention.edges.seconds(counts(combined, found, by_slot=sharing(contention, mode)))


def sharing(contention: Contention, mode: str) -> bool:
    """Free slots share each device (processor sharing); else each stream takes its nodes in list order."""
    return mode == "free" and bool(contention.free)


def spans(combined: list[SlotNode], seconds: Callable[[SlotNode], float], contention: Contention,
          mode: str) -> list[tuple[float, float]]:
    """(start, end) of each node as :func:`predict` schedules it, before any fitted edge cost."""
    alone = [seconds(x) for x in combined]
    shared = sharing(contention, mode)
    found = _shared(combined, alone, contention) if shared else serial(combined, alone, contention)
    if not contention.shared:
        return found
    stretched = [t * (1 + share * (contention.shared.get(_device(x), 1.0) - 1)) if _device(x) else t
                 for x, t, share in zip(combined, alone, _overlaps(found, combined))]
    return _shared(combined, stretched, contention) if shared else serial(combined, stretched, contention)


def _device(x: SlotNode) -> str | None:
    """The device a compute node runs on; None for a copy."""
    return None if x.node.launch is None else x.node.devices[0]


def serial(combined: list[SlotNode], times: list[float],
           contention: Contention | None = None) -> list[tuple[float, float]]:
    """(start, end) of each node, each starting once its dependencies have ended and its stream has
    finished the nodes before it in the list (``slots.makespan`` is the last end); with
    ``contention``'s waits and forks across streams where it has them (module docstring)."""
    spans: list[tuple[float, float]] = []
    free_at: dict[str, float] = {}
    held = contention.held(combined) if contention else [0.0] * len(combined)
    for k, (x, t) in enumerate(zip(combined, times)):
        start = max([free_at.get(x.node.stream, 0.0)]
                    + [spans[d][1] + (contention.wait(x, combined[d]) if contention else 0.0) for d in x.deps])
        spans.append((start, start + t))
        free_at[x.node.stream] = start + t + held[k]
    return spans


def _shared(combined: list[SlotNode], times: list[float], contention: Contention) -> list[tuple[float, float]]:
    """(start, end) of each node with the compute nodes in flight on a device sharing it
    (processor sharing with the device's ``gain``); a node starts once its dependencies and the
    node before it on its slot's stream have ended. Each device keeps a virtual clock of the work
    one of its nodes has received, so a node ends when its device's clock reaches its start reading
    plus its time: events cost a heap operation, not a pass over every node in flight. A node whose
    dependencies ended starts once the latest of them ended plus ``contention.wait`` (another
    stream's) or the fork it ``held`` (its own stream's): a pending start."""
    n = len(combined)
    waiting = [0] * n
    needs: list[set[int]] = [set() for _ in range(n)]
    after: list[list[int]] = [[] for _ in range(n)]
    last: dict[tuple[int, str], int] = {}
    for k, x in enumerate(combined):
        deps = set(x.deps)
        previous = last.get((x.slot, x.node.stream))
        if previous is not None:
            deps.add(previous)
        last[x.slot, x.node.stream] = k
        needs[k] = deps
        waiting[k] = len(deps)
        for d in deps:
            after[d].append(k)
    starts, ends = [0.0] * n, [0.0] * n
    clock: dict[str, float] = {}  # device -> work received by each of its nodes in flight so far
    flight: dict[str, list[tuple[float, int]]] = {}  # device -> heap of (clock reading at its end, node)
    copies: list[tuple[float, int]] = []  # (end time, node)
    link_free: dict[str, float] = {}  # copy stream -> when its last copy ends: a stream's copies queue
    pending: list[tuple[float, int]] = []  # (start, node): dependencies ended, waiting across devices
    held = contention.held(combined)
    now = 0.0

    def begin(k: int) -> None:
        starts[k] = now
        device = _device(combined[k])
        if device is None:
            stream = combined[k].node.stream
            link_free[stream] = max(now, link_free.get(stream, 0.0)) + times[k]
            heapq.heappush(copies, (link_free[stream], k))
        else:
            heapq.heappush(flight.setdefault(device, []), (clock.get(device, 0.0) + times[k], k))

    for k in range(n):
        if not waiting[k]:
            begin(k)
    done = 0
    while done < n:
        rate = {d: contention.gain(d, len(h)) / len(h) for d, h in flight.items() if h}
        # the next end, of a copy (None) or of a compute node on a device; a pending start before it goes first
        candidates: list[tuple[float, str | None]] = [(end, None) for end, _ in copies[:1]]
        candidates += [(now + (h[0][0] - clock.get(d, 0.0)) / rate[d], d) for d, h in flight.items() if h]
        when, device = min(candidates, key=lambda c: c[0], default=(float("inf"), None))
        starting = bool(pending) and pending[0][0] <= when
        if starting:
            when = pending[0][0]
        for d, r in rate.items():  # every device's nodes in flight received work until ``when``
            clock[d] = clock.get(d, 0.0) + (when - now) * r
        now = when
        if starting:
            begin(heapq.heappop(pending)[1])
            continue
        k = heapq.heappop(copies)[1] if device is None else heapq.heappop(flight[device])[1]
        ends[k] = now
        done += 1
        for m in after[k]:
            waiting[m] -= 1
            if not waiting[m]:
                ready = max(ends[d] + (held[d] if combined[d].node.stream == combined[m].node.stream
                                       else contention.wait(combined[m], combined[d])) for d in needs[m])
                if ready > now:
                    heapq.heappush(pending, (ready, m))
                else:
                    begin(m)
    return list(zip(starts, ends))


Union = tuple[list[float], list[float], list[float]]  # merged intervals: starts, ends, busy time before each


def _overlaps(spans: list[tuple[float, float]], combined: list[SlotNode]) -> list[float]:
    """Each node's share of its span during which a compute node of another device runs."""
    devices = {d for x in combined if (d := _device(x))}
    unions = {d: _union([sp for sp, x in zip(spans, combined) if _device(x) == d]) for d in devices}
    out = []
    for (start, end), x in zip(spans, combined):
        mine = _device(x)
        if mine is None or end <= start:
            out.append(0.0)
            continue
        covered = sum(_busy_until(unions[d], end) - _busy_until(unions[d], start) for d in devices - {mine})
        out.append(min(1.0, covered / (end - start)))
    return out


def _union(spans: list[tuple[float, float]]) -> Union:
    merged: list[list[float]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    before, total = [], 0.0
    for s, e in merged:
        before.append(total)
        total += e - s
    return [s for s, _ in merged], [e for _, e in merged], before


def _busy_until(union: Union, t: float) -> float:
    """Busy time of the union from 0 to ``t``."""
    starts, ends, before = union
    i = bisect_right(starts, t) - 1
    return 0.0 if i < 0 else before[i] + min(t, ends[i]) - starts[i]
