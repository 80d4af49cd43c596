"""Units of placement across devices that captured a step with different kernels.

Each device captures the step itself (DESIGN, "Place, second shape"): cuBLAS, cuDNN and Triton
pick kernels per device, and a composite op can even dispatch to other ATen ops (SDPA is one
cuDNN op on an H200 and a run of thirteen ops, matmuls and a softmax, in its math form). So
launches are matched by the ATen op that made them, not by kernel:

* :func:`align` lines each device's ops up with the home device's (difflib over op name and the
  extents and modes of the tensors it touched). Where every device's ops agree, each op is a unit
  of its own; a run where any device differs — one op against thirteen — is one unit on every
  device. A *unit* is what moves between devices: all of its launches go together.
* :func:`unit_program` is one device's capture as a :class:`~kernelfleet.kernels.ir.Program` whose
  launches are the units, with the bytes each unit reads from before it (what no earlier launch of
  the unit wrote) and writes, in that device's addresses. Everything downstream — flows,
  transfers, the schedule, the validator, the MILP — runs on it unchanged.
* :func:`carried` uses the same matching to carry a plan to another capture of the same code at
  other shapes (the server's decode step at a shorter context), whose ops match by name.

Pure: captures and programs in, plain data out.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Access, Launch, Program, merged_ranges
from kernelfleet.kernels.raw import RawCapture, RawOp, program_nodes

Key = tuple[str, tuple[tuple[int, str], ...]]


def op_key(op: RawOp) -> Key:
    """What makes two devices' op calls the same call: the op and the shape of what it touched."""
    return op.name, tuple((t.extent_bytes, t.mode) for t in op.tensors)


@dataclass(frozen=True, slots=True)
class UnitView:
    """One device's side of the aligned units: for unit u, its op calls ``ops[u]`` = [first, end),
    its launches (indices into the device's own assembled program) ``launches[u]``, and the unit
    program in the device's own addresses."""

    raw: RawCapture
    ops: list[tuple[int, int]]
    launches: list[list[int]]
    program: Program

    def nodes(self) -> list[list[int]]:
        """The graph node indices of each unit's launches, in capture order."""
        of_launch = program_nodes(self.raw)
        return [[of_launch[i] for i in unit] for unit in self.launches]

    def same_calls(self, other: UnitView, unit: int) -> bool:
        """Unit ``unit`` is the same op calls on both devices (so their tensors pair one to one)."""
        (a0, a1), (b0, b1) = self.ops[unit], other.ops[unit]
        return a1 - a0 == b1 - b0 and all(op_key(self.raw.ops[a0 + k]) == op_key(other.raw.ops[b0 + k])
                                          for k in range(a1 - a0))


def _boundaries(home: list[Key], other: list[Key]) -> dict[int, int]:
    """Home op boundaries (i: before op i) at which the other device's ops split the same way, each
    with its other-device boundary: inside runs of equal ops and at the ends of differing runs, not
    where the other device inserts ops (they could go either side)."""
    seen: dict[int, set[int]] = defaultdict(set)
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(a=home, b=other, autojunk=False).get_opcodes():
        if tag == "equal":
            for k in range(a1 - a0 + 1):
                seen[a0 + k].add(b0 + k)
        else:
            seen[a0].add(b0)
            seen[a1].add(b1)
    found = {i: next(iter(js)) for i, js in seen.items() if len(js) == 1}
    found[0], found[len(home)] = 0, len(other)  # the step starts and ends together everywhere
    return found


def align(raws: dict[str, RawCapture], home: str, key: Callable[[RawOp], object] = op_key
          ) -> dict[str, list[tuple[int, int]]]:
    """Each device's op range of every unit (module docstring); ``home`` names the device whose ops
    the others are lined up with, ``key`` what makes two ops the same call (:func:`carried` lines up
    captures of other shapes by the op's name alone). UsageError for a capture without ATen ops
    (captured with ``record_ops=False``: nothing to match by)."""
    for name, raw in raws.items():
        if program_nodes(raw) and not raw.ops:
            raise UsageError(f"{name}: its capture recorded no ATen ops, so its launches cannot be matched "
                             "across devices (capture with ops recorded)")
    keys = {name: [key(op) for op in raw.ops] for name, raw in raws.items()}
    maps = {name: _boundaries(keys[home], keys[name]) for name in raws if name != home}
    cuts = sorted(set(range(len(keys[home]) + 1)).intersection(*(m.keys() for m in maps.values())))
    maps[home] = {i: i for i in cuts}
    kept = [cuts[0]]
    for i in cuts[1:]:
        # a unit with no op on some device (ops it fused into a neighbour) grows into the next
        if len(kept) > 1 and any(m[kept[-1]] == m[kept[-2]] for m in maps.values()):
            kept[-1] = i
        else:
            kept.append(i)
    if len(kept) > 2 and any(m[kept[-1]] == m[kept[-2]] for m in maps.values()):
        del kept[-2]  # the last one joins the one before
    return {name: [(maps[name][a], maps[name][b]) for a, b in pairwise(kept)] for name in raws}


def units_of(raw: RawCapture, ops: list[tuple[int, int]]) -> list[list[int]]:
    """The launches of each unit (indices into the program assembled from ``raw``): those of its op
    calls, and any launch between two op calls (made outside any op) with the unit before it."""
    of_launch = program_nodes(raw)
    starts = [raw.ops[first].first if first < end else None for first, end in ops]
    out: list[list[int]] = [[] for _ in ops]
    unit = 0
    for launch, node in enumerate(of_launch):
        while unit + 1 < len(ops) and starts[unit + 1] is not None and node >= starts[unit + 1]:
            unit += 1
        out[unit].append(launch)
    return out


def _scratch(launch: Launch, access: Access, reading: bool) -> bool:
    # graph.deps.flows: a conservative access inside an op call, and the read of an own_reads
    # access (its own call's fresh bytes), carry data only between that call's kernels, never
    # between units
    return launch.op_index is not None and (access.source == "conservative" or (reading and access.own_reads))


def _minus(ranges: list[tuple[int, int]], cut: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` less every byte of ``cut`` (both merged and sorted)."""
    out = []
    for start, end in ranges:
        for s, e in cut:
            if e <= start or s >= end:
                continue
            if s > start:
                out.append((start, s))
            start = max(start, e)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def unit_program(program: Program, launches: list[list[int]]) -> Program:
    """``program`` with each unit as one launch (module docstring): reads are the bytes a unit's
    launches read that no earlier launch of the unit wrote, writes every byte they write, outside
    the op calls' own scratch. A unit is pinned where one of its launches is."""
    out = []
    for u, members in enumerate(launches):
        written: dict[int, list[tuple[int, int]]] = defaultdict(list)
        reads: dict[int, list[tuple[int, int]]] = defaultdict(list)
        names, pinned = [], None
        for i in members:
            launch = program.launches[i]
            pinned = pinned or launch.pinned
            if launch.op is not None and launch.op not in names:
                names.append(launch.op)
            for a in launch.accesses:
                if a.reads and not _scratch(launch, a, reading=True):
                    reads[a.buffer] += _minus([(a.offset_bytes, a.end)], merged_ranges(written[a.buffer]))
            for a in launch.accesses:
                if a.writes and not _scratch(launch, a, reading=False):
                    written[a.buffer] = merged_ranges(written[a.buffer] + [(a.offset_bytes, a.end)])
        accesses = [Access(b, s, e - s, "read", "schema") for b in sorted(reads) for s, e in merged_ranges(reads[b])]
        accesses += [Access(b, s, e - s, "write", "schema") for b in sorted(written) for s, e in written[b]]
        name = names[0] if len(names) == 1 else f"{len(names)} ops: {', '.join(n.split('.')[1] for n in names[:3])}…"
        out.append(Launch(u, "kernel", name, tuple(accesses), op=names[0] if len(names) == 1 else None,
                          pinned=pinned))
    return Program(program.buffers, out, units=True)


def views(raws: dict[str, RawCapture], programs: dict[str, Program], home: str) -> dict[str, UnitView]:
    """Every device's :class:`UnitView` of the units :func:`align` finds (``programs``: each
    capture assembled)."""
    ranges = align(raws, home)
    out = {}
    for name, raw in raws.items():
        if len(program_nodes(raw)) != len(programs[name].launches):
            raise UsageError(f"{name}: the program has {len(programs[name].launches)} launches, its capture "
                             f"{len(program_nodes(raw))}")
        members = units_of(raw, ranges[name])
        out[name] = UnitView(raw, ranges[name], members, unit_program(programs[name], members))
    return out


def differing_units(views_: dict[str, UnitView], home: str) -> set[int]:
    """The units that launch other kernels on some device than on ``home``."""
    names = {d: [[v.raw.nodes[i].name for i in unit] for unit in v.nodes()] for d, v in views_.items()}
    return {u for u in range(len(views_[home].ops)) if any(n[u] != names[home][u] for n in names.values())}


def carried(assignment: list[str], chains: list[list[int]], raw: RawCapture, to_chains: list[list[int]],
            to: RawCapture) -> list[str]:
    """A plan made for one capture carried to another capture of the same code at other shapes,
    where the libraries may launch other kernels for some calls: the server's decode step at a
    shorter context (serve/placed_build.py). ``assignment`` places ``raw``'s placed launches (the
    graph nodes of each: ``chains``, launches or units); the result places ``to``'s (``to_chains``).

    The two captures' ops are lined up by name alone (:func:`align`: their tensors' extents change
    with the shapes). A unit's launches in ``to`` go where its launches in ``raw`` ran: to their one
    device, or launch by launch where both launch the same kernels for it; a unit that launched
    nothing in ``raw`` goes where the launch before it ran. UsageError naming the op where a unit's
    launches ran on several devices and the kernels differ, or where one of ``to``'s placed
    launches would be split between devices. Whether the result fits its devices is the
    validator's to say (runtime/plans.checked), and whether it computes the step the gate's."""
    ranges = align({"from": raw, "to": to}, "from", key=lambda op: op.name)
    device_of = {node: assignment[k] for k, chain in enumerate(chains) for node in chain}
    of_from, of_to = program_nodes(raw), program_nodes(to)
    there: dict[int, str] = {}
    last = assignment[0] if assignment else ""
    for u, (mine, theirs) in enumerate(zip(units_of(raw, ranges["from"]), units_of(to, ranges["to"]))):
        nodes, targets = [of_from[i] for i in mine], [of_to[i] for i in theirs]
        devices = [device_of[n] for n in nodes]
        if len(set(devices)) <= 1:
            there.update(dict.fromkeys(targets, devices[0] if devices else last))
        elif [raw.nodes[n].name for n in nodes] == [to.nodes[n].name for n in targets]:
            there.update(zip(targets, devices))
        else:
            first, end = ranges["from"][u]
            raise UsageError(f"{raw.ops[first].name if first < end else 'launches outside any op'}: its launches run "
                             f"on {', '.join(sorted(set(devices)))} and the other capture launches other kernels "
                             "for it, so the plan does not say where they go")
        last = devices[-1] if devices else last
    out = []
    for chain in to_chains:
        devices = {there[n] for n in chain} or {out[-1] if out else last}  # a unit of no launch: anywhere
        if len(devices) > 1:
            raise UsageError(f"a placed launch of the other capture ({to.nodes[chain[0]].name}) would run on "
                             f"{' and '.join(sorted(devices))}")
        out.append(devices.pop())
    return out
