"""Repeated-layer compression: find the repeating block, solve one block, replicate it.

A transformer step is a prologue, the same block of kernels repeated once per layer, and an
epilogue. :func:`find_repeats` finds the longest run of identical blocks (same kernels, launch
shapes and pins, runnable on the same devices, in the same order); :func:`classes` maps
every launch to a *class*: launches in the same position of every repeat share a class,
prologue and epilogue launches are classes of their own.

The MILP then places classes instead of launches. Its cost terms stay exact: a device's
compute is the sum over its classes of the class's summed cost, and an edge between two
launches is cut exactly when their classes are on different devices, so edges aggregate by
class pair (edges inside a class are never cut). What changes is the search space: every
repeat is placed alike. The compressed optimum is therefore **exact among plans that place
every layer alike**, and an upper bound on the true optimum otherwise. It is the true
optimum when some optimal plan places all layers alike (kernel-level splits where each layer
balances on its own, e.g. GEMMs on the compute-rich device and attention on the
bandwidth-rich one); it is not when the best plan is a layer pipeline (layers 0-15 on one
device, 16-31 on another). ``groups > 1`` splits the repeats into that many contiguous runs,
each placed alike within itself, which also represents pipeline-like plans at a cost of
``groups`` times the block's variables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernelfleet.plan.model import Problem


@dataclass(frozen=True, slots=True)
class Repeats:
    """Launches ``start + r * period + i`` for r < count, i < period are alike in every r."""

    start: int
    period: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.period * self.count


def signatures(problem: Problem) -> list[int]:
    """One integer per launch; equal integers mean launches of the same kernel, shape and pin that
    can run on the same devices. Costs need not be equal: a class's cost is the exact sum of its
    members' (measured costs differ a little from layer to layer)."""
    seen: dict[tuple, int] = {}
    out = []
    for launch, row in zip(problem.program.launches, problem.costs.seconds):
        key = (launch.kind, launch.name, launch.grid, launch.block, launch.pinned,
               tuple(row.get(d) is None for d in problem.names))
        out.append(seen.setdefault(key, len(seen)))
    return out


def find_repeats(problem: Problem, min_count: int = 2) -> Repeats | None:
    """The repeated block covering the most launches (smallest period on ties), or None."""
    sig = np.asarray(signatures(problem), dtype=np.int64)
    n = len(sig)
    best: Repeats | None = None
    for period in range(1, n // min_count + 1):
        same = sig[:-period] == sig[period:]  # same[i]: launch i is like launch i + period
        # longest run of True: a run of length L starting at s gives (L + period) // period repeats
        padded = np.concatenate(([False], same, [False]))
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        starts, stops = edges[::2], edges[1::2]
        if len(starts) == 0:
            continue
        lengths = stops - starts
        i = int(np.argmax(lengths))
        count = (int(lengths[i]) + period) // period
        if count < min_count:
            continue
        candidate = Repeats(int(starts[i]), period, count)
        if best is None or candidate.period * candidate.count > best.period * best.count:
            best = candidate
    return best


def classes(problem: Problem, repeats: Repeats | None, groups: int = 1) -> list[int]:
    """Class id per launch (ids 0..n_classes-1, in first-appearance order); the launches of each of
    ``problem.groups`` (kept on one device) share their classes."""
    n = len(problem.program.launches)
    key_of: list[tuple] = [("single", k) for k in range(n)]
    if repeats is not None:
        groups = max(1, min(groups, repeats.count))
        for k in range(repeats.start, repeats.end):
            r, i = divmod(k - repeats.start, repeats.period)
            key_of[k] = ("block", r * groups // repeats.count, i)
    parent: dict[tuple, tuple] = {}

    def root(key: tuple) -> tuple:
        while parent.get(key, key) != key:
            key = parent[key]
        return key

    for group in problem.groups:
        first = root(key_of[group[0]])
        for k in group[1:]:
            other = root(key_of[k])
            if other != first:
                parent[other] = first
    ids: dict[tuple, int] = {}
    return [ids.setdefault(root(key), len(ids)) for key in key_of]
