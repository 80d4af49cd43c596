"""An independent check that a plan's graph hands every launch the bytes a one-device run would.

``plan/transfers.py`` decides what to copy from the flows (``graph.deps.flows``); ``schedule.races``
checks that nothing conflicting runs unordered. Neither checks that the copies, where they land,
give each reader what it reads: a copy that lands after a kernel on the reader's device rewrote
the same bytes puts older bytes back. That happened on an H200: ``aten.sort`` fills an index
workspace with one kernel and copies it into its output with a memcpy node; the plan copied an
earlier op's bytes into that workspace between the two, the sort returned garbage indices, and a
gather downstream tripped a device-side assert that ended the process's CUDA context.

:func:`stale_reads` runs the graph's list of nodes (a topological order; ``races`` makes every
other order equivalent) over each device's memory as *versions*: which launch last wrote each
byte. It runs the program once on its home device as the reference, then the plan's nodes, and
compares what each launch reads with what it read in the reference, and what the step leaves
behind (outputs at home, state where the next step reads it) with what the reference left.

Memory follows the model of ``graph.deps.flows``: an op call's conservative writes (its workspace)
are a layer of their own, seen only by that call's kernels, over the public bytes everyone sees;
a kernel of the call sees, at each byte, whichever of the two was written last. A copy moves
bytes, so it moves every layer. A conservative or ``own_reads`` access is compared only where the
reference saw its own call's bytes (what such an access actually reads); any other read,
everywhere. Before the step every device holds the same state (the runtime restores every
replica alike) but for the step's inputs, which only the home device has.

Pure: programs and nodes in, lines out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator

from kernelfleet.graph.deps import overwritten
from kernelfleet.kernels.ir import Access, Launch, Program
from kernelfleet.plan.schedule import Node

INITIAL, ABSENT = -1, -2  # before the step: the replica's own state; an input only home was given
Segments = list[tuple[int, int, int]]  # sorted, non-overlapping (start, end, version)


class Memory:
    """Every device's bytes as versions: a public layer and, per op call, a scratch layer."""

    def __init__(self, program: Program, home: str) -> None:
        self.inputs = {b.id for b in program.buffers if b.role == "input"}
        self.home = home
        self.layers: dict[tuple[str, int, int | None], Segments] = defaultdict(list)  # (device, buffer, call)
        self.scratch: dict[tuple[int, str], set[int]] = defaultdict(set)  # (buffer, device) -> calls with a layer
        # a call's scratch is read by nobody once all its kernels ran, in whatever order: its layers go then
        self.left = Counter(launch.op_index for launch in program.launches if launch.op_index is not None)

    def _default(self, device: str, buffer: int) -> int:
        return ABSENT if buffer in self.inputs and device != self.home else INITIAL

    def public(self, device: str, buffer: int, start: int, end: int) -> Segments:
        """The public versions of [start, end) on ``device``, gaps as the device held them before the step."""
        return _filled(self.layers[device, buffer, None], start, end, self._default(device, buffer))

    def seen(self, device: str, launch: Launch, access: Access) -> Segments:
        """What ``launch`` reads through ``access`` on ``device``: per byte the later of the public
        version and its own call's scratch (module docstring)."""
        pieces = self.public(device, access.buffer, access.offset_bytes, access.end)
        if launch.op_index is None:
            return pieces
        for start, end, version in _clipped(self.layers.get((device, access.buffer, launch.op_index), []),
                                            access.offset_bytes, access.end):
            later = [(s, e, v) for s, e, v in _clipped(pieces, start, end) if v < version]
            for s, e, _ in later:
                pieces = overwritten(pieces, s, e, version)
        return pieces

    def write(self, device: str, launch: Launch) -> None:
        """``launch``'s writes on ``device``; its call's scratch gone once the call's every kernel ran."""
        for a in launch.accesses:
            if a.writes:
                call = launch.op_index if a.source == "conservative" else None
                key = (device, a.buffer, call)
                self.layers[key] = overwritten(self.layers[key], a.offset_bytes, a.end, launch.index)
                if call is not None:
                    self.scratch[a.buffer, device].add(call)
        if launch.op_index is None:
            return
        self.left[launch.op_index] -= 1
        if not self.left[launch.op_index]:
            for (buffer, where), calls in self.scratch.items():
                if launch.op_index in calls:
                    calls.discard(launch.op_index)
                    del self.layers[where, buffer, launch.op_index]

    def copy(self, src: str, dst: str, buffer: int, start: int, end: int) -> None:
        """Bytes [start, end) of ``buffer`` from ``src`` to ``dst``, every layer."""
        for s, e, v in self.public(src, buffer, start, end):
            self.layers[dst, buffer, None] = overwritten(self.layers[dst, buffer, None], s, e, v)
        for call in self.scratch[buffer, src] | self.scratch[buffer, dst]:
            moved = _clipped(self.layers.get((src, buffer, call), []), start, end)
            kept = sorted([*_cut(self.layers.get((dst, buffer, call), []), start, end), *moved])
            if kept or (dst, buffer, call) in self.layers:
                self.layers[dst, buffer, call] = kept
                self.scratch[buffer, dst].add(call)


def stale_reads(program: Program, assignment: list[str], home: str, nodes: list[Node],
                resident_state: bool = False) -> list[str]:
    """Every read of the plan graph ``nodes`` (``schedule.schedule`` of ``assignment``) that gets
    other bytes than in the one-device run, and every output or state byte left elsewhere than the
    next step reads it (module docstring); empty when the graph delivers every byte."""
    launches = program.launches
    reference, expected = Memory(program, home), {}
    for launch in launches:
        for k, access in enumerate(launch.accesses):
            if access.reads:
                expected[launch.index, k] = reference.seen(home, launch, access)
        reference.write(home, launch)
    memory, found = Memory(program, home), []
    for n in nodes:
        if n.copy is not None:
            t = n.copy
            memory.copy(t.src, t.dst, t.buffer, t.offset_bytes, t.offset_bytes + t.length_bytes)
            continue
        launch, device = launches[n.launch], assignment[n.launch]
        for k, access in enumerate(launch.accesses):
            if access.reads:
                found += _differences(launches, launch, access, expected[launch.index, k],
                                      memory.seen(device, launch, access), device)
        memory.write(device, launch)
    return found + _left_behind(program, assignment, home, reference, memory, resident_state)


def _differences(launches: list[Launch], launch: Launch, access: Access, want: Segments, got: Segments,
                 device: str) -> list[str]:
    internal = launch.op_index is not None and (access.source == "conservative" or access.own_reads)
    out = []
    for start, end, version in want:
        if internal and (version < 0 or launches[version].op_index != launch.op_index):
            continue  # such an access reads only what its own call wrote (module docstring)
        for s, e, v in _clipped(got, start, end):
            if v != version:
                out.append(f"launch {launch.index} ({launch.op or launch.name}) on {device} reads buffer "
                           f"{access.buffer} [{s}, {e}) {_as(v)}; one device reads it {_as(version)}")
    return out


def _left_behind(program: Program, assignment: list[str], home: str, reference: Memory, memory: Memory,
                 resident_state: bool) -> list[str]:
    """Outputs at home, and state (named, not a weight) at home or, with ``resident_state``, on every
    device whose launches read those bytes, as the reference left them."""
    readers: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for launch in program.launches:
        for a in launch.accesses:
            if a.reads:
                readers[a.buffer].append((a.offset_bytes, a.end, assignment[launch.index]))
    out = []
    for b in program.buffers:
        state = b.name is not None and b.role not in ("weight", "output")
        if b.role != "output" and not state:
            continue
        for start, end, version in reference.layers[home, b.id, None]:
            if b.role == "output" or not resident_state:
                targets = {home}
            else:
                targets = {d for s, e, d in readers[b.id] if s < end and start < e}
            for device in sorted(targets):
                for s, e, v in memory.public(device, b.id, start, end):
                    if v != version:
                        out.append(f"after the step, {device} holds {b.name or f'buffer {b.id}'} [{s}, {e}) {_as(v)}; "
                                   f"one device leaves it {_as(version)}")
    return out


def _as(version: int) -> str:
    return {INITIAL: "as it was before the step", ABSENT: "without the input ever copied there"}.get(
        version, f"as launch {version} left it")


def _clipped(segments: Segments, start: int, end: int) -> Segments:
    return [(max(s, start), min(e, end), v) for s, e, v in segments if s < end and e > start]


def _cut(segments: Segments, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    for s, e, v in segments:
        if s < start:
            yield s, min(e, start), v
        if e > end:
            yield max(s, end), e, v


def _filled(segments: Segments, start: int, end: int, default: int) -> Segments:
    out, at = [], start
    for s, e, v in _clipped(segments, start, end):
        if s > at:
            out.append((at, s, default))
        out.append((s, e, v))
        at = max(at, e)
    if at < end:
        out.append((at, end, default))
    return out
