"""The plan's graph as plain data, and an independent check that it has no data race.

:func:`schedule` lays out what the executor builds (``runtime/executor.py`` only materialises it
with the driver): every launch on its device and every copy of ``transfers``, in capture order,
each node depending on the previous node of each device it touches. Nodes on different devices
run concurrently wherever no dependency orders them.

:func:`races` checks such a graph without trusting how it was built: per device and buffer, every
pair of nodes that touch overlapping bytes, one of them writing, must be ordered by a path of
dependencies in the direction of the sequential (capture) order. Otherwise the GPU may run them
the other way round: a read before the write it needs, or a write over bytes still to be read.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kernelfleet.kernels.ir import Program
from kernelfleet.runtime.transfers import START, Transfer, transfers


@dataclass(frozen=True, slots=True)
class Node:
    index: int
    launch: int | None  # a launch of the program, or None for a copy
    copy: Transfer | None
    devices: tuple[str, ...]  # where it runs: (device,) for a launch, (src, dst) for a copy
    deps: tuple[int, ...]


def schedule(program: Program, assignment: list[str], home: str) -> list[Node]:
    """Launches and copies in capture order, each after the previous node of each of its devices."""
    by_position: dict[int, list[Transfer]] = defaultdict(list)
    for t in transfers(program, assignment, home):
        by_position[t.before].append(t)
    nodes: list[Node] = []
    last: dict[str, int] = {}

    def add(launch: int | None, copy: Transfer | None, devices: tuple[str, ...]) -> None:
        deps = tuple(sorted({last[d] for d in devices if d in last}))
        nodes.append(Node(len(nodes), launch, copy, devices, deps))
        for d in devices:
            last[d] = len(nodes) - 1

    for t in by_position.get(START, []):
        add(None, t, (t.src, t.dst))
    for i, device in enumerate(assignment):
        for t in by_position.get(i, []):
            add(None, t, (t.src, t.dst))
        add(i, None, (device,))
    for t in by_position.get(len(assignment), []):
        add(None, t, (t.src, t.dst))
    return nodes


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
