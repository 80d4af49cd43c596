"""Check a program's access claims against what a replay on the GPU observed.

Two observations, both made by ``replay.py`` while running the step node by node with its
real state:

* **memory-diff**: the bytes each launch changed, per buffer. A changed byte outside the
  launch's claimed write set means the claim is *unsound* (a consumer on another device
  would miss that write) — the one failure that matters. A claimed write that changed
  nothing is fine: a kernel may write what was already there, and claims may over-approximate.
  Memory-diff sees changed bytes only, so it bounds the write set from below.
* **ptx-dynamic**: the lowest and highest address each probed memory instruction touched. A
  range not inside a static access of the same direction is a *disagreement* with the static
  analysis.

``with_observations`` adds what was observed to the program as ``memory-diff`` and
``ptx-dynamic`` accesses, so a program is at least as large as what was seen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kernelfleet.kernels.ir import Access, Program

Range = tuple[int, int, int]  # (buffer, start offset, end offset)


@dataclass(frozen=True, slots=True)
class Finding:
    launch: int
    buffer: int | None  # None: the address is in no buffer of the program
    start: int
    end: int
    what: str  # "unsound write" | "read outside static" | "write outside static" | "outside buffers"


def _covered(claims: list[Access], buffer: int, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) of ``buffer`` that no claim covers."""
    gaps = [(start, end)]
    for a in claims:
        if a.buffer != buffer:
            continue
        gaps = [piece for s, e in gaps for piece in ((s, min(e, a.offset_bytes)), (max(s, a.end), e)) if piece[0] < piece[1]]
    return gaps


def unsound_writes(program: Program, observed: dict[int, list[Range]]) -> list[Finding]:
    """Changed bytes outside each launch's claimed writes."""
    findings = []
    for launch, ranges in sorted(observed.items()):
        claims = [a for a in program.launches[launch].accesses if a.writes]
        for buffer, start, end in ranges:
            findings += [Finding(launch, buffer, s, e, "unsound write") for s, e in _covered(claims, buffer, start, end)]
    return findings


def locate(program: Program, lo: int, hi: int) -> Range | None:
    """The buffer holding the address range [lo, hi), as (buffer, start, end) offsets."""
    for b in program.buffers:
        if b.address <= lo and hi <= b.address + b.size_bytes:
            return b.id, lo - b.address, hi - b.address
    return None


def probe_disagreements(program: Program, probed: dict[int, list[tuple[str, int, int]]]) -> list[Finding]:
    """Probed (mode, lo address, hi address) ranges that the static accesses do not cover."""
    findings = []
    for launch, ranges in sorted(probed.items()):
        accesses = program.launches[launch].accesses
        for mode, lo, hi in ranges:
            where = locate(program, lo, hi)
            if where is None:
                findings.append(Finding(launch, None, lo, hi, "outside buffers"))
                continue
            claims = [a for a in accesses if (a.reads if mode == "read" else a.writes)
                      and a.source in ("ptx-static", "conservative")]
            findings += [Finding(launch, where[0], s, e, f"{'read' if mode == 'read' else 'write'} outside static")
                         for s, e in _covered(claims, *where)]
    return findings


def with_observations(program: Program, writes: dict[int, list[Range]],
                      probed: dict[int, list[tuple[str, int, int]]]) -> Program:
    """The program with observed writes and probed ranges added as accesses of their source."""
    launches = []
    for launch in program.launches:
        extra = [Access(b, s, e - s, "write", "memory-diff") for b, s, e in writes.get(launch.index, ())]
        for mode, lo, hi in probed.get(launch.index, ()):
            where = locate(program, lo, hi)
            if where is not None:
                extra.append(Access(where[0], where[1], where[2] - where[1],
                                    "read" if mode == "read" else "write" if mode == "write" else "readwrite",
                                    "ptx-dynamic"))
        launches.append(replace(launch, accesses=launch.accesses + tuple(extra)) if extra else launch)
    return Program(list(program.buffers), launches)

