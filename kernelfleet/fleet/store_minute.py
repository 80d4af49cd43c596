"""The minute being written, summed in memory as its windows arrive, so that closing it writes its
rollups (one row per GPU, one per job and GPU) instead of rereading its raw rows.

The sums are columns with a place per GPU of the batch's layout, one column per quantity (seconds,
stale seconds, each metric's value x seconds, each metric's seconds without a value). A batch of
1-s windows is kept as it comes (a reference to each of its metric columns: a value is its own
value x seconds) and summed once, when the minute closes, by a ``map`` of ``sum`` over each
quantity's columns (in C: the per-row Python of a row-by-row sum cost more than the SQL roll it
replaces, and one flat list a batch, copied from its columns and checked for missing values, cost a
tenth of the writer's window at 1,000 GPUs). A batch of other windows (the sampler's measured
windows, 1.0001 s and the like) is added up as it comes, every metric's values times their seconds
in one ``map`` (its products kept to the close cost 1.7x as much at 1,000 GPUs).

A GPU whose jobs were the same all minute has its job rows from its own sums times each job's
share; the rest is left to the SQL roll from raw rows (store_roll.py), which is what every minute
was before:

* ``dirty`` GPUs: a job started, ended or changed its share on them within the minute;
* ``whole_dirty``: the minute holds windows written before its first batch here (a writer stopped,
  or killed, mid-minute: raw rows are on disk, the sums were not), a window written again or late,
  a batch reaching into two minutes, or a batch whose GPUs are not those of the first.

Nothing is lost on a crash: the sums are only ever a shortcut to what the raw rows say.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain, compress, cycle, repeat
from operator import add, mul, sub

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
        self.seconds = [0.0] * n
        self.stale_seconds = [0.0] * n
        self.metric_sums = [[0.0] * n for _ in METRICS]  # value x seconds
        self.missing = [[0.0] * n for _ in METRICS]  # seconds without a value
        # the columns of each quantity not yet summed (see _fold); batches of 1-s windows are counted
        self._seconds: list[Sequence[float]] = []
        self._stale: list[list[float]] = []
        self._metrics: list[list[Sequence[float | None]]] = [[] for _ in METRICS]
        self._unit_windows = 0
        self._weighted: list[float] | None = None  # the other batches' values x seconds, a run of n places a metric
        self.class_seconds = [[0.0] * n for _ in BOTTLENECKS]
        # A GPU's class seldom changes from one window to the next: while the batch's classes are
        # the last batch's, their windows wait in one list, summed and spread over the classes when they change
        self._run_codes: Sequence[int] = ()
        self._run_seconds: list[Sequence[float]] = []

    def add(self, ids: list[int], window_seconds: Sequence[float], metrics: Sequence[Sequence[float | None]],
            codes: Sequence[int], stale: Sequence[bool] | None) -> None:
        """Add one window batch (columns in the order of ``ids``; ``stale`` None: none stale), or
        give the minute to the SQL roll."""
        if self.whole_dirty:
            return
        if ids != self.ids:
            self.whole_dirty = True
            return
        self.windows += 1
        ws = window_seconds
        if stale is not None:
            self._stale.append(list(map(mul, stale, ws)))
        if ws.count(1.0) == self.n:
            # the columns as they come: a value is its own value x seconds, a missing one is found
            # when the minute is summed (a float sum in C fails on it)
            self._unit_windows += 1
            for kept, column in zip(self._metrics, metrics):
                kept.append(column if type(column) is tuple else tuple(column))  # a list changed later must not count
        else:  # values x seconds added up as they come (kept to the close, 1.7x the cost at 1,000 GPUs)
            self._seconds.append(ws)
            weighted = repeat(0.0) if self._weighted is None else self._weighted
            try:  # every metric in one map: seven cost 1.5 us each at 8 GPUs
                self._weighted = list(map(add, weighted, map(mul, chain(*metrics), cycle(ws))))
            except TypeError:  # a metric without a value: its seconds are missing ones
                filled = chain.from_iterable(self._fill(m, column, ws) for m, column in enumerate(metrics))
                self._weighted = list(map(add, weighted, filled))
        if codes == self._run_codes:
            self._run_seconds.append(ws)
        else:
            self._spread_run()
            self._run_codes, self._run_seconds = codes, [ws]

    def _fill(self, m: int, column: Sequence[float | None], ws: Iterable[float]) -> list[float]:
        """Metric ``m``'s column x seconds with 0 for a missing value, whose seconds go to ``missing``."""
        missing, filled = self.missing[m], []
        for k, (value, w) in enumerate(zip(column, ws)):
            if value is None:
                missing[k] += w
                filled.append(0.0)
            else:
                filled.append(value * w)
        return filled

    def _fold(self) -> None:
        """Add every column kept so far to the sums (in the order they came)."""
        if self._seconds:
            self.seconds = list(map(sum, zip(self.seconds, *self._seconds)))
        if self._unit_windows:
            self.seconds = [s + self._unit_windows for s in self.seconds]
        if self._stale:
            self.stale_seconds = list(map(sum, zip(self.stale_seconds, *self._stale)))
        n, weighted = self.n, self._weighted
        for m, kept in enumerate(self._metrics):
            if weighted is not None:
                kept.append(weighted[m * n:(m + 1) * n])
            if kept:
                try:
                    self.metric_sums[m] = list(map(sum, zip(self.metric_sums[m], *kept)))
                except TypeError:  # a value missing in a 1-s window (the others were filled as they came)
                    filled = [self._fill(m, c, repeat(1.0, n)) if None in c else c for c in kept]
                    self.metric_sums[m] = list(map(sum, zip(self.metric_sums[m], *filled)))
                kept.clear()
        self._weighted = None
        self._seconds, self._stale, self._unit_windows = [], [], 0

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
        then each metric's sum and seconds with a value. Made column by column (the sums' columns
        zipped in C): a row-by-row loop took 28 ms of the 44-ms minute close at 1,000 GPUs."""
        clean = self._clean()
        if clean == []:
            return []
        self._fold()
        n, seconds = self.n, self.seconds
        columns: list[Iterable[float]] = [self.ids, repeat(self.bucket, n), seconds, self.stale_seconds]
        for sums, missing in zip(self.metric_sums, self.missing):
            columns += (sums, list(map(sub, seconds, missing)))
        rows = zip(*columns)
        return list(rows if clean is None else compress(rows, clean))

    def job_rows(self) -> list[tuple[float, ...]]:
        """job_1m rows of the clean GPUs: one per job that held the GPU all minute."""
        clean = self._clean()
        if clean == []:
            return []
        self._fold()
        windows, bucket, holds = self.windows, self.bucket, self.holds
        self._spread_run()
        seconds, ofu_sums = self.seconds, self.metric_sums[_OFU]
        ofu_seconds = list(map(sub, seconds, self.missing[_OFU]))
        places = zip(self.ids, seconds, ofu_sums, ofu_seconds, zip(*self.class_seconds))
        rows = []
        for gpu, s, o, os_, classes in (places if clean is None else compress(places, clean)):
            for job_id, (share, approximate) in holds.get(gpu, _NO_JOBS).items():
                rows.append((job_id, bucket, gpu, windows, s, share * windows, o, os_, share * o, share * os_,
                             int(approximate), *classes))
        return rows
