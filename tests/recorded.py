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


def side_by_side(recordings: list[Path], out: Path, windows: slice = slice(None)) -> Path:
    """A trace in which recording i is GPU i of one machine, window by window (as long as the shortest):
    what a multi-GPU node looks like, built from single-GPU recordings without changing a value but
    the GPU's index, its uuid (made distinct) and the window's time (the first recording's)."""
    import dataclasses

    from kernelfleet.telemetry.replay import ReplaySource, TraceWriter

    runs = [list(ReplaySource(path).batches())[windows] for path in recordings]
    with TraceWriter(out, note="side by side: " + ", ".join(p.name for p in recordings)) as writer:
        for batches in zip(*runs):
            stamp = batches[0][0].timestamp_seconds
            writer.write([dataclasses.replace(batch[0], gpu_index=i, uuid=f"{batch[0].uuid}-{i}", timestamp_seconds=stamp)
                          for i, batch in enumerate(batches)])
    return out
