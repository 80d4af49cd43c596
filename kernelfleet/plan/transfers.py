"""What a plan must copy between devices, and where those bytes live in each device's capture.

Pure functions on programs and plans (STYLE: plans are data; the runtime trusts validated ones).

Every device holds a full replica of the step, captured there: the same kernels, at other
addresses. A plan runs each launch on one device, so bytes must move whenever a launch reads what
a launch on another device wrote (a *flow*, ``graph.deps.flows``):

* before the step, the inputs, from the home device to every device that reads them;
* during it, each cross-device flow's exact byte range, right before its reader — copied once per
  (writer, range, device), since a later write to those bytes on the reader's device would make
  that launch the last writer and so a flow of its own. A reader inside an op call that passes
  data through its own workspace (``graph.deps.together``) gets it before the call's first kernel
  on its device instead: that kernel may write the same bytes through the workspace (``aten.sort``
  fills an index workspace that its memcpy node then reads), and a copy landing after it would
  overwrite them;
* after it, every output whose last writer ran away from home, back to home; and each named state
  buffer's (caches, SSM state) last-written bytes either back to home, so home holds exactly what a
  single-device run would, or — with ``resident_state`` — to every other device that reads those
  bytes in the plan, so the next step finds them wherever it reads them and a cache never travels
  home (DESIGN: state is kept where the plan uses it).

Addresses are translated launch by launch (:class:`AddressMap`): the k-th exactly known access of
launch i in one capture is the k-th of launch i in the other, at the same offset. Buffers are not
matched as wholes — the allocator's reuse of memory can merge different tensors into one buffer in
one capture and not in the other. Where the devices captured different kernels, a plan places
units (``graph/units.py``) and addresses are translated through the op calls the units share
(:class:`UnitAddressMap`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import flows, together
from kernelfleet.graph.units import UnitView
from kernelfleet.kernels.ir import Access, Program

START = -1  # Transfer.before for copies made before the first launch


@dataclass(frozen=True, slots=True)
class Transfer:
    before: int  # the launch it must precede; START, or len(launches) for after the last one
    writer: int | None  # the launch that wrote the bytes (None: a step input)
    reader: int | None  # the launch that reads them (None: copied home at the end)
    buffer: int  # a buffer of the home capture's program, and the bytes in it
    offset_bytes: int
    length_bytes: int
    src: str  # device names
    dst: str


def transfers(program: Program, assignment: list[str], home: str, resident_state: bool = False) -> list[Transfer]:
    """Every copy ``assignment`` needs, in execution order (see the module docstring)."""
    if len(assignment) != len(program.launches):
        raise UsageError(f"the plan places {len(assignment)} launches; the program has {len(program.launches)}")
    buffers = {b.id: b for b in program.buffers}
    out: list[Transfer] = []
    first_reader: dict[tuple[int, str], int] = {}
    for launch in program.launches:
        for a in launch.accesses:
            if a.reads and buffers[a.buffer].role == "input":
                first_reader.setdefault((a.buffer, assignment[launch.index]), launch.index)
    for (b, device), reader in sorted(first_reader.items()):
        if device != home:
            out.append(Transfer(START, None, reader, b, 0, buffers[b].size_bytes, home, device))
    moved: dict[tuple[int, int, str], set[tuple[int, int]]] = defaultdict(set)  # (writer, buffer, device) -> ranges
    found, final = flows(program)
    call_of = {k: group for group in together(program, found) for k in group}
    for f in found:
        src, dst = assignment[f.src], assignment[f.dst]
        if src != dst and (f.start, f.end) not in moved[f.src, f.buffer, dst]:
            moved[f.src, f.buffer, dst].add((f.start, f.end))
            before = f.dst
            if f.dst in call_of and f.src not in call_of[f.dst]:  # before the call's first kernel there
                before = max(f.src + 1, min(k for k in call_of[f.dst] if assignment[k] == dst))
            out.append(Transfer(before, f.src, f.dst, f.buffer, f.start, f.end - f.start, src, dst))
    end = len(program.launches)
    readers: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    if resident_state:
        for launch in program.launches:
            for a in launch.accesses:
                if a.reads:
                    readers[a.buffer].append((a.offset_bytes, a.end, assignment[launch.index]))
    for b, segments in sorted(final.items()):
        buffer = buffers[b]
        state = buffer.name is not None and buffer.role not in ("weight", "output")
        if buffer.role != "output" and not state:
            continue
        for s, e, w in segments:
            if buffer.role == "output" or not resident_state:
                targets = {home}
            else:
                targets = {d for rs, re_, d in readers[b] if rs < e and s < re_}
            out += [Transfer(end, w, None, b, s, e - s, assignment[w], d) for d in sorted(targets)
                    # unless a flow already carried the writer's bytes there
                    if d != assignment[w] and not any(x <= s and e <= y for x, y in moved[w, b, d])]
    return sorted(out, key=lambda t: t.before)  # stable: flows stay in reader order


def _known(accesses: tuple[Access, ...]) -> list[Access]:
    # Conservative accesses come from pointer-like words in parameter bytes, which may be stale
    # struct padding that differs between captures: only exactly known accesses are paired.
    return [a for a in accesses if a.source != "conservative"]


class _Inputs:
    """A step input is the same named buffer in every capture."""

    def __init__(self, other: Program) -> None:
        self._inputs = {b.name: b for b in other.buffers if b.role == "input" and b.name}

    def translate_input(self, name: str, address_in_buffer: int) -> int:
        if name not in self._inputs:
            raise UsageError(f"input {name!r} is not in the other capture")
        return self._inputs[name].address + address_in_buffer


class AddressMap(_Inputs):
    """Translates home-capture addresses into another capture of the same step."""

    def __init__(self, home: Program, other: Program) -> None:
        if [(x.kind, x.name) for x in home.launches] != [(x.kind, x.name) for x in other.launches]:
            raise UsageError("the two captures launch different kernels: not the same step")
        self.home, self.other = home, other
        self._home_buffers = {b.id: b for b in home.buffers}
        self._other_buffers = {b.id: b for b in other.buffers}
        self._home_at = {b.id: b.address for b in home.buffers}
        self._other_at = {b.id: b.address for b in other.buffers}
        super().__init__(other)

    def _exact_pairs(self, launch: int) -> list[tuple[int, int, int]]:
        """(home start, other start, length) of the exactly known accesses ``launch`` makes alike in both."""
        a, b = self.home.launches[launch], self.other.launches[launch]
        mine, theirs = _known(a.accesses), _known(b.accesses)
        if len(mine) != len(theirs):
            return []
        # alike: the same extent and mode; offsets inside buffers may differ, as the allocator can
        # merge a tensor with a neighbour in one capture and not in the other
        return [(self._home_at[x.buffer] + x.offset_bytes, self._other_at[y.buffer] + y.offset_bytes, x.length_bytes)
                for x, y in zip(mine, theirs) if (x.length_bytes, x.mode) == (y.length_bytes, y.mode)]

    def _pointer_pairs(self, launch: int) -> list[tuple[int, int, int]]:
        """Pointers found at the same parameter bytes of ``launch`` in both captures (a workspace,
        say), each with the room to the end of its buffer — only where both point at the same
        offset of buffers of the same size and role: a word that merely looks like a pointer (an
        address plus a flag bit, say) lands anywhere, and bytes copied by it would overwrite
        another tensor of the other capture."""
        a, b = self.home.launches[launch], self.other.launches[launch]
        theirs_at = {(p.index, q.at): q for p in b.params for q in p.pointers}
        pairs = []
        for p in a.params:
            for q in p.pointers:
                other = theirs_at.get((p.index, q.at))
                if other is None or q.offset_bytes != other.offset_bytes:
                    continue
                mine, theirs = self._home_buffers[q.buffer], self._other_buffers[other.buffer]
                if (mine.size_bytes, mine.role) == (theirs.size_bytes, theirs.role):
                    pairs.append((mine.address + q.offset_bytes, theirs.address + other.offset_bytes,
                                  mine.size_bytes - q.offset_bytes))
        return pairs

    def translate(self, launches: list[int | None], address: int, length: int) -> int:
        """Where [address, address + length) of the home capture lives in the other capture, as
        ``launches`` (the first preferred) touch it alike in both: by exactly known accesses, else
        by a pointer word. UsageError if none places it, or if two of them place it differently —
        then the bytes flow between them only in the home capture's layout (an access's extent
        overlapping another tensor there), and a copy into the other capture would overwrite
        whatever that capture keeps there."""
        known = [launch for launch in launches if launch is not None]
        placed = [there + (address - here) for x in known for here, there, size in self._exact_pairs(x)
                  if here <= address and address + length <= here + size]
        if len(set(placed)) > 1:
            raise UsageError(f"[{address:#x}, +{length}): launches {known} address it differently in the two "
                             "captures, so it only flows between them in one capture's layout (pin them together)")
        if placed:
            return placed[0]
        for x in known:
            for here, there, size in self._pointer_pairs(x):
                if here <= address and address + length <= here + size:
                    return there + (address - here)
        raise UsageError(f"[{address:#x}, +{length}) cannot be placed in the other capture: launches {launches} "
                         "do not touch it alike in both captures (pin them together)")



class UnitAddressMap(_Inputs):
    """Translates one device's addresses into another's capture of the same step with other kernels
    (``graph/units.py``): through the tensors of the op calls a unit makes alike on both devices —
    the k-th tensor of its k-th op call is the same tensor, view for view and storage for storage —
    else through the named regions (weights, inputs, outputs, module state) of both captures."""

    def __init__(self, home: UnitView, other: UnitView) -> None:
        if len(home.ops) != len(other.ops):
            raise UsageError(f"the two captures have {len(home.ops)} and {len(other.ops)} units: not aligned")
        self.home, self.other = home, other
        theirs = {r.name: r for r in other.raw.regions if r.name}
        self._regions = [(r.address, theirs[r.name].address, r.size_bytes) for r in home.raw.regions
                         if r.name in theirs and theirs[r.name].size_bytes == r.size_bytes]
        super().__init__(other.program)

    def _pairs(self, unit: int) -> list[tuple[int, int, int]]:
        """(home start, other start, length) of every view and storage ``unit``'s op calls touch alike."""
        if not self.home.same_calls(self.other, unit):
            return []
        (a0, a1), (b0, _) = self.home.ops[unit], self.other.ops[unit]
        out = []
        for k in range(a1 - a0):
            for x, y in zip(self.home.raw.ops[a0 + k].tensors, self.other.raw.ops[b0 + k].tensors):
                out.append((x.address, y.address, x.extent_bytes))
                if x.storage_bytes == y.storage_bytes:
                    out.append((x.storage_address, y.storage_address, x.storage_bytes))
        return out

    def translate(self, units: list[int | None], address: int, length: int) -> int:
        """Where [address, address + length) of the home capture lives in the other capture, as the
        units ``units`` (the first preferred) touch it; UsageError if no unit and no region places it,
        or if two place it differently."""
        for unit in (u for u in units if u is not None):
            placed = {there + (address - here) for here, there, size in self._pairs(unit)
                      if here <= address and address + length <= here + size}
            if len(placed) > 1:
                raise UsageError(f"[{address:#x}, +{length}): unit {unit}'s tensors place it at {len(placed)} "
                                 "addresses of the other capture")
            if placed:
                return placed.pop()
        for here, there, size in self._regions:
            if here <= address and address + length <= here + size:
                return there + (address - here)
        raise UsageError(f"[{address:#x}, +{length}) cannot be placed in the other capture: units {units} make "
                         "other op calls there, and it is in no named region (pin them together)")

