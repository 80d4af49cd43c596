"""The SM clock averaged over exactly a GPM window.

Under the power cap an H200's SM clock swings between ~1.0 and 1.98 GHz within a
second (DESIGN.md, Facts), so one read per window can be far from the window's
mean. A :class:`ClockPoller` holds every GPU's clock reads;
``step_mean`` turns the reads into a time-weighted mean over a window.

On an H200 (driver 580) a clock read costs ~2 µs in NVML, and the driver's own
clock-sample buffer (nvmlDeviceGetSamples) returns nothing, so host reads are
the way; the clock steps ~6 times a second, so 20 reads a second track it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# SM clock reads while a clock moves: every 250 ms, 4 reads a 1-s window instead of 10. Each read
# is a wake-up of the sampler, ~90 us of CPU on an H200 VM: under load 10 reads cost 1.42 ms per
# GPU-window and one 0.63 (docs/validation/h200-2026-12-01/sampler_cost-2.json), so 4 come to ~0.89,
# within the agent's 1-ms target on one GPU. Replayed on 2-ms reads recorded on an H200 as the
# sampler reads (validation/sampling.py, polled_clock_errors), a 1-s window's mean clock is then
# off by 0.29 % (bf16 GEMM loop) and 1.09 % (transformer loop) on average, biased by under 0.1 %,
# against 0.04 and 0.29 % at 100 ms and 0.25 and 0.77 % at 200 ms: at the OFU those loads ran at
# (0.68, 0.36), 0.20 and 0.39 pp, within the clock term's budget (docs/telemetry.md, "The clock
# poll default").
CLOCK_POLL_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class ClockWindow:
    mean: float | None
    last: float | None  # the last read at or before the window's end
    reads: int  # reads that fell inside the window
    moved: bool = False  # some read differed from the value before it: the clock is not holding still
    last_moved: bool = False  # the last read did (on the event path: a change no event announced)


def step_mean(
    reads: Sequence[tuple[float, float]], start: float, end: float, before: float | None
) -> ClockWindow:
    """Time-weighted mean of a step function over ``[start, end]``.

    ``reads`` are ``(time, value)`` pairs in time order, all inside the window;
    each value holds until the next read. ``before`` is the last value read
    before ``start`` (it holds from ``start`` to the first read); without it,
    the first read is extended back to ``start``.
    """
    if end <= start or (not reads and before is None):
        return ClockWindow(None, before, 0)
    value = before if before is not None else reads[0][1]
    t = start
    area = 0.0
    moved = last_moved = False
    for when, reading in reads:
        when = min(max(when, start), end)
        area += value * (when - t)
        last_moved = reading != value
        moved = moved or last_moved
        t, value = when, reading
    area += value * (end - t)
    return ClockWindow(area / (end - start), value, len(reads), moved, last_moved)


class ClockPoller:
    """Keeps each device's clock reads until the window that holds them is taken.

    The sampler's own loop calls :meth:`poll_once` between its sleeps, so no
    thread is needed: on an H200 VM a separate polling thread cost about twice
    the CPU of reads made from the loop that already wakes up (bench/sampler_cost.py).
    Each device has a read function giving its clock in hertz; a read that raises is
    skipped, so the window rests on fewer reads.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._polled: list[tuple[Callable[[], float], deque[tuple[float, float]]]] = []
        self._readers: dict[object, Callable[[], float]] = {}
        self._reads: dict[object, deque[tuple[float, float]]] = {}
        self._last: dict[object, float] = {}

    def watch(self, readers: Mapping[object, Callable[[], float]]) -> None:
        """Poll exactly these devices (key -> read) from now on."""
        self._reads = {k: deque() for k in readers}
        self._readers = dict(readers)
        self._polled = [(read, self._reads[k]) for k, read in readers.items()]
        self._last = {}

    def poll_once(self, now: float | None = None) -> None:
        """Read every device's clock, all at ``now`` (default: the clock now)."""
        # Every GPU is read at one timestamp: the reads of one wake-up lie microseconds apart,
        # far below the 100-ms steps the clock moves in, and one clock call per wake is cheaper.
        if now is None:
            now = self._clock()
        for read, pending in self._polled:
            try:
                pending.append((now, read()))
            except Exception:  # noqa: BLE001, S112 - a failed read only thins the window
                continue

    def poll_one(self, key: object) -> None:
        """Read one device's clock now (a clock-change event named it: telemetry/clock_events.py);
        an unknown key reads every device."""
        read = self._readers.get(key)
        if read is None:
            self.poll_once()
            return
        try:
            self._reads[key].append((self._clock(), read()))
        except Exception:  # noqa: BLE001 - a failed read only thins the window
            return

    def take(self, key: object, start: float, end: float) -> ClockWindow:
        """The window ``[start, end]`` for ``key``; reads up to ``end`` are consumed."""
        pending = self._reads.get(key, deque())
        inside: list[tuple[float, float]] = []
        while pending and pending[0][0] <= end:
            inside.append(pending.popleft())
        before = self._last.get(key)
        if inside:
            self._last[key] = inside[-1][1]
        return step_mean(inside, start, end, before)
