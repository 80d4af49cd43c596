"""Work done inside a window, from a loop's per-iteration timeline.

How MFU is measured against a counter window: a benchmark loop records the
wall-clock end of every iteration (from CUDA events); the work of an iteration
that straddles a window edge is split in proportion to the time on each side.
"""

from __future__ import annotations

from typing import Sequence


def work_between(
    start_wall: float, ends_wall: Sequence[float], work_per_iteration: float, start: float, end: float
) -> float:
    """Work completed in ``[start, end]`` by iterations that ran back to back from ``start_wall``."""
    total = 0.0
    previous = start_wall
    for finish in ends_wall:
        lo, hi = max(previous, start), min(finish, end)
        if hi > lo:
            total += work_per_iteration * (hi - lo) / (finish - previous)
        previous = finish
    return total
