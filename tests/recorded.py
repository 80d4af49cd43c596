"""Helpers for tests that replay recordings (importable: tests/ is on the path, see conftest.py)."""

from __future__ import annotations

from pathlib import Path


def at_end_of(*recordings: Path):
    """An agent's clock for replayed recordings: the end of their last window, standing still (time is
    passed in, STYLE rule 3). The agent refuses windows far from its clock, so a recording from the
    past is replayed at the time it was made."""
    from kernelfleet.telemetry.replay import ReplaySource

    end = max(s.timestamp_seconds for path in recordings for batch in ReplaySource(path).batches() for s in batch)
    return lambda: end



def misplaced_copies(views: dict, home: str, other: str, assignment: list[str]) -> tuple[int, list]:
    """Copies of a unit plan (``graph/units.py`` views by device, outputs at ``home``) to or from
    ``other`` whose bytes, translated into its capture, fall outside what their unit touches there
    (the reader's reads for a copy to it, the writer's writes for one from it), with the number of
    copies checked."""
    from kernelfleet.plan.transfers import UnitAddressMap, transfers

    mine, theirs = views[home], views[other]
    translate = UnitAddressMap(mine, theirs)
    buffers = {b.id: b for b in mine.program.buffers}
    there = {b.id: b for b in theirs.program.buffers}

    def touches(unit: int, address: int, length: int, mode: str) -> bool:
        return any(there[a.buffer].address + a.offset_bytes <= address
                   and address + length <= there[a.buffer].address + a.end
                   for a in theirs.program.launches[unit].accesses if a.mode == mode)

    checked, wrong = 0, []
    for t in transfers(mine.program, assignment, home):
        b = buffers[t.buffer]
        if other not in (t.src, t.dst):
            continue
        if t.writer is None:
            assert translate.translate_input(b.name, t.offset_bytes) >= 0
            continue
        at = translate.translate([t.reader, t.writer] if t.dst == other else [t.writer, t.reader],
                                 b.address + t.offset_bytes, t.length_bytes)
        unit, mode = (t.reader, "read") if t.dst == other else (t.writer, "write")
        checked += 1
        if unit is not None and not touches(unit, at, t.length_bytes, mode):
            wrong.append(t)
    return checked, wrong
