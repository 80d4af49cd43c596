"""The minute being written, summed in memory as its windows arrive, so that closing it writes its
rollups (one row per GPU, one per job and GPU) instead of rereading its raw rows.

The sums are columns with a place per GPU of the batch's layout. A window batch's values are kept
as they come (one flat list a batch) and summed once, when the minute closes, by one ``map`` of
``sum`` over them (in C: the per-row Python of a row-by-row sum cost more than the SQL roll it
replaces, and a ``map`` of additions at every batch cost the writer a tenth of its window; at 1,000
GPUs a minute's lists hold 4 MB of references). A GPU whose jobs were the same all minute
has its job rows from its own sums times each job's share; the rest is left to the SQL roll from raw
rows (store_roll.py), which is what every minute was before:

* ``dirty`` GPUs: a job started, ended or changed its share on them within the minute;
* ``whole_dirty``: the minute holds windows written before its first batch here (a writer stopped,
  or killed, mid-minute: raw rows are on disk, the sums were not), a window written again or late,
  a batch reaching into two minutes, or a batch whose GPUs are not those of the first.

Nothing is lost on a crash: the sums are only ever a shortcut to what the raw rows say.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain, compress, cycle, repeat
from operator import mul, sub

from kernelfleet.fleet.store_schema import BOTTLENECKS, METRICS

Holds = dict[int, dict[int, tuple[float, bool]]]  # gpu_id -> job_id -> (share, approximate)
_OFU = METRICS.index("ofu")
_NO_JOBS: dict[int, tuple[float, bool]] = {}


class OpenMinute:
    """The sums of minute ``bucket`` for the GPUs ``ids`` (in the order of the writer's batches)."""

    def __init__(self, bucket: int, ids: list[int], holds: Holds, whole_dirty: bool) -> None:
        self.bucket = bucket
        self.ids = ids
        self.holds = holds  # the jobs on each GPU at the minute's first window (the writer's, copied)
        self.whole_dirty = whole_dirty or len(set(ids)) != len(ids)
        self.dirty: set[int] = set()
        self.windows = 0
        self.n = n = len(ids)
        # one flat list, a run of n places per quantity: seconds, stale seconds, then each metric's
        # value x seconds; each batch's list of the same layout waits in _values until _fold(), but
        # for a batch of 1-s windows none stale, whose list holds the metrics only and is counted
        self.sums = [0.0] * (n * (2 + len(METRICS)))
        self._values: list[list[float]] = []
        self._unit_windows = 0
        self.missing = [0.0] * (n * len(METRICS))  # each metric's seconds without a value
        self.class_seconds = [[0.0] * n for _ in BOTTLENECKS]
        # A GPU's class seldom changes from one window to the next: while the batch's classes are
        # the last batch's, their windows wait in one list, summed and spread over the classes when they change
        self._run_codes: Sequence[int] = ()
        self._run_seconds: list[Sequence[float]] = []

    def add(self, ids: list[int], window_seconds: Sequence[float], metrics: Sequence[Sequence[float | None]],
            codes: Sequence[int], stale: Sequence[bool]) -> None:
        """Add one window batch (columns in the order of ``ids``), or give the minute to the SQL roll."""
        if self.whole_dirty:
            return
        if ids != self.ids:
            self.whole_dirty = True
            return
        self.windows += 1
        ws = window_seconds
        n, values = self.n, list(chain(*metrics))
        try:
            sum(values)  # a float sum in C: 4x faster than `None in values`, which compares each float to None
        except TypeError:  # a metric without a value: its seconds are missing ones
            for k, value in enumerate(values):
                if value is None:
                    values[k] = 0.0
                    self.missing[k] += ws[k % n]
        if ws.count(1.0) == n and True not in stale:
            # the agent's usual batch: 1-s windows, none stale; its seconds are counted, not summed
            # (two of the nine quantities a place, kept and folded for nothing)
            self._unit_windows += 1
        else:
            values[:0] = (*ws, *map(mul, stale, ws))
            values[2 * n:] = map(mul, values[2 * n:], cycle(ws))  # value x seconds
        self._values.append(values)
        if codes == self._run_codes:
            self._run_seconds.append(ws)
        else:
            self._spread_run()
            self._run_codes, self._run_seconds = codes, [ws]

    def _fold(self) -> list[float]:
        """The sums, with every batch added so far (in the order they came)."""
        if self._values:
            n, sums = self.n, self.sums
            timed = [v for v in self._values if len(v) == len(sums)]  # batches that carry seconds
            head = list(map(sum, zip(sums[:2 * n], *(v[:2 * n] for v in timed)))) if timed else sums[:2 * n]
            if self._unit_windows:
                head[:n] = (s + self._unit_windows for s in head[:n])
            tails = (v[2 * n:] if len(v) == len(sums) else v for v in self._values)
            self.sums = head + list(map(sum, zip(sums[2 * n:], *tails)))
            self._values, self._unit_windows = [], 0
        return self.sums

    def _spread_run(self) -> None:
        classes = self.class_seconds
        for k, (code, w) in enumerate(zip(self._run_codes, map(sum, zip(*self._run_seconds)))):
            classes[code][k] += w
        self._run_codes, self._run_seconds = (), []

    def _clean(self) -> list[bool] | None:
        """Which places' rollups come from the sums (None: every place's), or [] for none."""
        if self.whole_dirty:
            return []
        dirty = self.dirty
        return [gpu not in dirty for gpu in self.ids] if dirty else None

    def gpu_rows(self) -> list[tuple[float, ...]]:
        """rollup_1m rows of the clean GPUs, in its columns: gpu_id, bucket, seconds, stale seconds,
        then each metric's sum and seconds with a value. Made column by column (slices of the sums
        zipped in C): a row-by-row loop took 28 ms of the 44-ms minute close at 1,000 GPUs."""
        clean = self._clean()
        if clean == []:
            return []
        n, sums, missing = self.n, self._fold(), self.missing
        seconds = sums[:n]
        columns: list[Iterable[float]] = [self.ids, repeat(self.bucket, n), seconds, sums[n:2 * n]]
        for m in range(len(METRICS)):
            columns += (sums[(2 + m) * n:(3 + m) * n], list(map(sub, seconds, missing[m * n:(m + 1) * n])))
        rows = zip(*columns)
        return list(rows if clean is None else compress(rows, clean))

    def job_rows(self) -> list[tuple[float, ...]]:
        """job_1m rows of the clean GPUs: one per job that held the GPU all minute."""
        clean = self._clean()
        if clean == []:
            return []
        n, sums, windows, bucket, holds = self.n, self._fold(), self.windows, self.bucket, self.holds
        self._spread_run()
        seconds = sums[:n]
        ofu_sums = sums[(2 + _OFU) * n:(3 + _OFU) * n]
        ofu_seconds = list(map(sub, seconds, self.missing[_OFU * n:(_OFU + 1) * n]))
        places = zip(self.ids, seconds, ofu_sums, ofu_seconds, zip(*self.class_seconds))
        rows = []
        for gpu, s, o, os_, classes in (places if clean is None else compress(places, clean)):
            for job_id, (share, approximate) in holds.get(gpu, _NO_JOBS).items():
                rows.append((job_id, bucket, gpu, windows, s, share * windows, o, os_, share * o, share * os_,
                             int(approximate), *classes))
        return rows
