"""The plan's graph as plain data, and an independent check that it has no data race.

:func:`schedule` lays out what the executor builds (``runtime/executor.py`` only materialises it
with the driver): every launch on its device and every copy of ``transfers``, listed in capture
order (the inputs first, each launch after its copies, the copies home last). Dependencies point
back in the list, so the list is a topological order. Each node names a *stream*: ``compute:A``
for the launches of device A, ``link:A->B`` for the copies from A to B. The nodes of a stream form
a chain in list order (through a path of dependencies, not always a direct one) — one compute
stream per device, one copy at a time per link — so an executor may issue each stream in order on
one CUDA stream. Two sets of dependencies:

* overlapping (the default): a node depends on the previous node of its stream and on every
  earlier node that touches the same bytes of the same device, one of the two writing, and on
  nothing else (dependencies implied by others are left out). So a copy waits, on its source, only
  for the launch that wrote its bytes (an input, for nothing) and, on its destination, for the
  earlier nodes that read or write the bytes it overwrites; its reader (and any later node that
  touches those bytes there) waits for it, and so does the next node that overwrites its source
  bytes. Copies run while both devices compute.
* conservative (``overlap=False``): each node after the previous node of each device it touches,
  so a copy stalls compute on both its devices. The baseline the overlapping one is measured
  against.

:func:`races` checks such a graph without trusting how it was built: per device and buffer, every
pair of nodes that touch overlapping bytes, one of them writing, must be ordered by a path of
dependencies in the direction of the sequential (capture) order. Otherwise the GPU may run them
the other way round: a read before the write it needs, or a write over bytes still to be read.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from kernelfleet.kernels.ir import Program
from kernelfleet.plan.transfers import START, Transfer, transfers


@dataclass(frozen=True, slots=True)
class Node:
    """A launch or a copy of the plan's graph, to run after the nodes ``deps`` (list indices)."""

    index: int
    launch: int | None  # a launch of the program, or None for a copy
    copy: Transfer | None
    devices: tuple[str, ...]  # where it runs: (device,) for a launch, (src, dst) for a copy
    stream: str  # "compute:A" or "link:A->B": the nodes of one stream are a chain in list order
    deps: tuple[int, ...]


def schedule(program: Program, assignment: list[str], home: str, overlap: bool = True,
             resident_state: bool = False) -> list[Node]:
    """Launches and copies in capture order, with overlapping or conservative dependencies (see the
    module docstring); ``resident_state`` as for ``transfers``."""
    by_position: dict[int, list[Transfer]] = defaultdict(list)
    for t in transfers(program, assignment, home, resident_state):
        by_position[t.before].append(t)
    placed: list[Transfer | int] = list(by_position[START])
    for i in range(len(assignment)):
        placed += by_position[i] + [i]
    placed += by_position[len(assignment)]
    nodes = []
    for k, x in enumerate(placed):
        if isinstance(x, int):
            nodes.append(Node(k, x, None, (assignment[x],), f"compute:{assignment[x]}", ()))
        else:
            nodes.append(Node(k, None, x, (x.src, x.dst), f"link:{x.src}->{x.dst}", ()))
    deps = _by_conflict(program, assignment, nodes) if overlap else _by_device(nodes)
    return [replace(n, deps=d) for n, d in zip(nodes, deps)]


def _by_device(nodes: list[Node]) -> list[tuple[int, ...]]:
    last: dict[str, int] = {}
    out = []
    for n in nodes:
        out.append(tuple(sorted({last[d] for d in n.devices if d in last})))
        last.update((d, n.index) for d in n.devices)
    return out


def _by_conflict(program: Program, assignment: list[str], nodes: list[Node]) -> list[tuple[int, ...]]:
    last: dict[str, int] = {}  # by stream
    # per (device, buffer): (node, start, end, writes) of the earlier accesses no later write covers
    seen: dict[tuple[str, int], list[tuple[int, int, int, bool]]] = defaultdict(list)
    ancestors: list[int] = []  # bitsets
    out = []
    for n in nodes:
        needed = {last[n.stream]} if n.stream in last else set()
        touches = list(_touches(program, assignment, n))
        for device, buffer, start, end, writes in touches:
            needed.update(other for other, s, e, other_writes in seen[device, buffer]
                          if (writes or other_writes) and s < end and start < e)
        for device, buffer, start, end, writes in touches:
            if writes:  # later nodes that touch what this write covers reach the earlier ones through it
                seen[device, buffer] = [x for x in seen[device, buffer] if not start <= x[1] <= x[2] <= end]
        for device, buffer, start, end, writes in touches:
            seen[device, buffer].append((n.index, start, end, writes))
        last[n.stream] = n.index
        # latest first: whatever could imply a dependency comes after it in the list, so is counted by then
        kept, implied = [], 0
        for d in sorted(needed, reverse=True):
            if not implied >> d & 1:
                kept.append(d)
                implied |= ancestors[d]
        ancestors.append(implied | sum(1 << d for d in kept))
        out.append(tuple(sorted(kept)))
    return out


def races(program: Program, assignment: list[str], nodes: list[Node]) -> list[str]:
    """Conflicting pairs of nodes (same device, overlapping bytes, one writes) the dependencies
    leave unordered; empty for a race-free graph."""
    ancestors: list[int] = []  # bitsets
    for n in nodes:
        bits = 0
        for d in n.deps:
            bits |= ancestors[d] | (1 << d)
        ancestors.append(bits)
    seen: dict[tuple[str, int], list[tuple[int, int, int, bool]]] = defaultdict(list)  # (node, start, end, writes)
    found: list[str] = []
    for n in nodes:
        touches = list(_touches(program, assignment, n))
        for device, buffer, start, end, writes in touches:
            for other, s, e, other_writes in seen[device, buffer]:
                if (writes or other_writes) and s < end and start < e and not ancestors[n.index] >> other & 1:
                    found.append(f"node {n.index} ({_label(n)}) and node {other} ({_label(nodes[other])}) touch "
                                 f"buffer {buffer} [{max(s, start)}, {min(e, end)}) on {device} unordered")
        for device, buffer, start, end, writes in touches:  # a node does not race with itself
            seen[device, buffer].append((n.index, start, end, writes))
    return found


def _touches(program: Program, assignment: list[str], n: Node):
    if n.launch is not None:
        device = assignment[n.launch]
        for a in program.launches[n.launch].accesses:
            yield device, a.buffer, a.offset_bytes, a.end, a.writes
        return
    t = n.copy
    yield t.src, t.buffer, t.offset_bytes, t.offset_bytes + t.length_bytes, False
    yield t.dst, t.buffer, t.offset_bytes, t.offset_bytes + t.length_bytes, True


def _label(n: Node) -> str:
    return f"launch {n.launch}" if n.launch is not None else f"copy {n.copy.src}->{n.copy.dst}"
