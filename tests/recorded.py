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
