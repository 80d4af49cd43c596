"""The store's writer: a window batch (its raw rows and which jobs held its GPUs) in one
transaction, so a crash loses at most the batch being written; the minutes it closed are rolled up
in the same transaction (store_roll.py)."""

from __future__ import annotations

import functools
import operator
import sqlite3
from collections.abc import Sequence
from itertools import repeat

from kernelfleet.fleet import store_roll
from kernelfleet.fleet.store_lock import transaction
from kernelfleet.fleet.store_minute import Holds, OpenMinute
from kernelfleet.fleet.store_rows import Batch, GpuKey, Hold
from kernelfleet.fleet.store_schema import BOTTLENECKS, KEY, METRICS, OPEN, floor, span

_WIDTH = 5 + len(METRICS)  # a sample's values: gpu_id, ts, window_seconds, the metrics, bottleneck, stale
# A window's rows go in statements of many rows each, not one statement a row (executemany): one
# statement keeps its cursor on samples from row to row, where each of executemany's rows seeks
# the table from its root and is reset and stepped on its own. At 1,000 GPUs a window's insert took
# 2.1-2.5 ms of CPU against executemany's 3.2-3.4 (chunks of 100-1,000 rows within 0.2 ms of each
# other); at 8 GPUs the two are even, so small batches keep executemany.
_MANY_ROWS = 32
_ROWS_A_STATEMENT = 100


@functools.lru_cache(maxsize=8)
def _insert_samples(rows: int) -> str:
    """INSERT of ``rows`` samples, the values of row r in ?(12r+1)...?(12r+12), its key made of its ts and gpu_id."""
    def row(o: int) -> str:
        key = KEY.replace(":ts", f"?{o + 2}").replace(":gpu_id", f"?{o + 1}")
        return f"({key}, {', '.join(f'?{o + i}' for i in range(1, _WIDTH + 1))})"

    return f"INSERT OR REPLACE INTO samples VALUES {', '.join(row(_WIDTH * r) for r in range(rows))}"


_CODES = {name: i for i, name in enumerate(BOTTLENECKS)}
_UNKNOWN = BOTTLENECKS.index("unknown")
_NONE: dict = {}  # a GPU no job holds
_GPU_KEY = operator.itemgetter(0, 1, 2)  # a GpuKey's host, uuid, mig_instance


class Writer:
    """The writing half of a store, on the writer's own connection (the caller serialises calls).

    It remembers the ids it gave GPUs and jobs, and the holds it has open: gpu_id -> job_id ->
    (share, approximate), and where each began. A hold's end reaches the file when it closes, not
    at every window.
    """

    def __init__(self, db: sqlite3.Connection, rolled_until: int | None) -> None:
        self.db = db
        self.rolled_until = rolled_until
        self._gpu_ids: dict[tuple[str, str, int], int] = {}
        self._job_ids: dict[str, tuple[int, str, str | None]] = {}
        self._holds: Holds = {}
        self._since: dict[tuple[int, int], float] = {}
        self._newest: dict[int, float] = {}  # each GPU's newest window written here
        self._holds_adopted = False
        self._id_of: dict[tuple[str, str, int | None], int] = {}  # _gpu_ids by the row's own fields
        self._last_gpus: Sequence[GpuKey] = ()  # the last batch's GPUs, and their ids
        self._last_ids: list[int] = []
        self._minute: OpenMinute | None = None  # the minute being written, summed as it comes
        # the last batch's jobs and GPUs, and the newest window of any GPU: a batch with the same
        # jobs on the same GPUs, all newer, changes no hold (the agent's every window but a few)
        self._signature: tuple | None = None
        self._signature_ids: list[int] | None = None
        self._newest_any = float("-inf")
        self._unsettled: tuple[list[int], Sequence[float]] | None = None  # see _settle
        self._last_names: Sequence[str] = ()  # the last batch's classes, and their codes
        self._last_codes: list[int] = []
        self._zeros: list[int] = []  # the stale flags of a batch none stale
        # SQLite's limit on a statement's parameters (999 before 3.32) caps the rows a statement
        self._rows_a_statement = min(_ROWS_A_STATEMENT, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // _WIDTH)

    def write(self, batch: Batch) -> None:
        """Write one window batch in one transaction; roll up the minutes it closed."""
        if not batch.gpus:
            return
        with transaction(self.db):
            if not self._holds_adopted:
                # holds a writer before this one left open (a crash) end at the newest window on file
                self.db.execute("UPDATE holds SET until = MAX(since, COALESCE((SELECT ts FROM samples ORDER BY key DESC "
                                "LIMIT 1), since)) WHERE until = ?", (OPEN,))
                self._holds_adopted = True
            ids = self._ids(batch.gpus)
            ts, window_seconds, metrics, stale = batch.ts, batch.window_seconds, batch.metrics, batch.stale
            codes = self._codes(batch.bottleneck)
            oldest, newest = min(ts), max(ts)
            lo, hi = floor(oldest, 60), floor(newest, 60)
            # A writer's first minute may hold windows another wrote before it (a crash mid-minute)
            on_file = self._minute is None and self.db.execute(
                "SELECT 1 FROM samples WHERE key >= ? LIMIT 1", (span(hi, OPEN)["lo_key"],)).fetchone() is not None
            fresh = True not in stale  # none stale: the agent's every window but a few
            self._insert(ids, ts, window_seconds, metrics, codes, stale, fresh)
            changed, late = self._hold(ids, ts, batch.holds, oldest, newest)
            if self.rolled_until is None:
                # Nothing rolled yet: start at the oldest window on file, not this batch's. A first
                # writer stopped (or killed) before its first minute closed left windows behind that
                # the next writer would otherwise never roll (the fault campaign found it).
                first_on_file = self.db.execute("SELECT ts FROM samples ORDER BY key LIMIT 1").fetchone()[0]
                self.rolled_until = floor(first_on_file, 60)  # this batch is on file already
            minute = self._minute
            if hi > self.rolled_until:  # the batch closes the open minute (and any before it)
                if minute is not None and lo <= minute.bucket:
                    minute.whole_dirty = True  # some of this batch's windows are in it
                store_roll.roll(self.db, self.rolled_until, hi, minute)
                self.rolled_until = hi
                minute = None
            if hi < self.rolled_until:
                return  # windows of minutes rolled already: kept raw, as before
            if minute is None:  # the batch opens the minute: the jobs on its GPUs now are its jobs
                self._minute = minute = OpenMinute(hi, ids, dict(self._holds), whole_dirty=on_file or late or lo < hi)
            elif late or lo < hi:
                minute.whole_dirty = True
            else:
                minute.dirty.update(changed)  # a job came or went within the minute
            minute.add(ids, window_seconds, metrics, codes, None if fresh else stale)

    def _insert(self, ids: list[int], ts: Sequence[float], window_seconds: Sequence[float],
                metrics: Sequence[Sequence[float | None]], codes: list[int], stale: Sequence[bool], fresh: bool) -> None:
        """A window's rows into samples: by executemany when few, else in statements of many rows."""
        n = len(ids)
        # stale as ints: sqlite3 binds an exact int, float or str directly, but a bool (or None) only
        # after its adapter lookup fails, ~1 us a value (a fifth of a window at 8 GPUs)
        if fresh:
            if len(self._zeros) != n:
                self._zeros = [0] * n
            flags: Sequence[int] = self._zeros
        else:
            flags = list(map(int, stale))
        if n < _MANY_ROWS:
            self.db.executemany(_insert_samples(1), zip(ids, ts, window_seconds, *metrics, codes, flags))
            return
        # the rows' values one after another, each column laid in by a slice assignment (in C: a
        # zip of the columns flattened by a chain took 3.5x as long, 0.25 ms a window at 1,000 GPUs)
        values: list[object] = [0] * (n * _WIDTH)
        for place, column in enumerate((ids, ts, window_seconds, *metrics, codes, flags)):
            values[place::_WIDTH] = column
        for start in range(0, n, self._rows_a_statement):
            k = min(self._rows_a_statement, n - start)
            self.db.execute(_insert_samples(k), values[start * _WIDTH:(start + k) * _WIDTH])

    def _codes(self, names: Sequence[str]) -> list[int]:
        """Each row's class as its code; a GPU's class seldom changes, so the last batch's mostly serve."""
        if names != self._last_names:
            names = names if type(names) is tuple else tuple(names)  # kept: a list changed later must not match
            self._last_names, self._last_codes = names, list(map(_CODES.get, names, repeat(_UNKNOWN)))
        return self._last_codes

    def close_holds(self) -> None:
        """End the open holds at their GPUs' last windows (a clean stop)."""
        self._settle()
        with transaction(self.db):
            for gpu, spans in self._holds.items():
                for job_id in spans:
                    self._close_hold(gpu, job_id, self._newest[gpu])
        self._holds.clear()

    def forget_jobs(self) -> None:
        """Retention deleted jobs: their ids are no longer on file."""
        self._job_ids.clear()
        self._signature = None

    def add_event(self, ts: float, kind: str, detail: str, gpu_uuid: str | None, job: str | None) -> None:
        gpu_id = None
        if gpu_uuid is not None:
            found = self.db.execute("SELECT gpu_id FROM gpus WHERE uuid = ?", (gpu_uuid,)).fetchone()
            gpu_id = found[0] if found else None
        self.db.execute("INSERT INTO events (ts, kind, gpu_id, job, detail) VALUES (?, ?, ?, ?, ?)",
                        (ts, kind, gpu_id, job, detail))

    def _hold(self, ids: list[int], ts: Sequence[float], jobs: Sequence[Hold], oldest: float,
              newest: float) -> tuple[set[int], bool]:
        """Open or close the holds of the batch's GPUs where their jobs changed: which GPUs changed,
        and whether a window was no newer than its GPU's newest (late, or written again: it changes
        no hold). ``oldest`` and ``newest``: the batch's oldest and newest window."""
        signature = jobs if type(jobs) is tuple else tuple(jobs)  # (the agent's batches: a tuple, compared as it is)
        if signature == self._signature and ids == self._signature_ids and oldest > self._newest_any:
            # the same jobs on the same GPUs as the last batch, every window newer: every hold goes
            # on. Each GPU's newest window is set when a batch next needs it (a dict update of every
            # GPU a window cost a tenth of this writer's Python at 1,000 GPUs)
            self._unsettled = ids, ts
            self._newest_any = newest
            return set(), False
        self._settle()
        held: Holds = {}
        for j in jobs:
            gpu = self._gpu_ids[(j.host, j.uuid, -1 if j.mig_instance is None else j.mig_instance)]
            held.setdefault(gpu, {})[self._job_id(j)] = (j.share, j.approximate)
        changed, late = set(), False
        for gpu, t in zip(ids, ts):
            last = self._newest.get(gpu)
            if last is not None and t <= last:
                late = True
                continue
            self._newest[gpu] = t
            now, spans = held.get(gpu, _NONE), self._holds.get(gpu, _NONE)
            if now == spans:  # the same jobs at the same shares: every open hold goes on, in memory
                continue
            changed.add(gpu)
            for job_id, kept in spans.items():
                if now.get(job_id) != kept:
                    self._close_hold(gpu, job_id, last)
            for job_id, (share, approximate) in now.items():
                if spans.get(job_id) != (share, approximate):
                    self.db.execute("INSERT OR REPLACE INTO holds VALUES (?, ?, ?, ?, ?, ?)",
                                    (job_id, gpu, t, OPEN, share, int(approximate)))
                    self._since[gpu, job_id] = t
            self._holds[gpu] = now
        self._newest_any = max(self._newest_any, newest)
        # a batch with a late window left some holds as they were: the next may not take the shortcut
        self._signature, self._signature_ids = (None, None) if late else (signature, ids)
        return changed, late

    def _settle(self) -> None:
        """Each GPU's newest window, from the last batch that took the shortcut in ``_hold``."""
        if self._unsettled is not None:
            self._newest.update(zip(*self._unsettled))
            self._unsettled = None

    def _close_hold(self, gpu: int, job_id: int, until: float) -> None:
        self.db.execute("UPDATE holds SET until = ? WHERE gpu_id = ? AND since = ? AND job_id = ?",
                        (until, gpu, self._since.pop((gpu, job_id)), job_id))

    def _job_id(self, j: Hold) -> int:
        found = self._job_ids.get(j.job)
        if found is None or found[1] != j.kind or found[2] != j.user:
            self.db.execute("INSERT INTO jobs (name, kind, user) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                            "kind = excluded.kind, user = COALESCE(excluded.user, user)", (j.job, j.kind, j.user))
            job_id = self.db.execute("SELECT job_id FROM jobs WHERE name = ?", (j.job,)).fetchone()[0]
            found = self._job_ids[j.job] = (job_id, j.kind, j.user)
        return found[0]

    def _ids(self, gpus: Sequence[GpuKey]) -> list[int]:
        """The gpu_id of every row (registering the GPUs never seen); the agent's batches name the
        same GPUs window after window, so the last batch's ids mostly serve."""
        gpus = tuple(gpus)  # kept as the last batch's: a list the caller changes later must not match
        if gpus == self._last_gpus:
            return self._last_ids
        ids = list(map(self._id_of.get, map(_GPU_KEY, gpus)))
        if None in ids:
            ids = [self._gpu_id(g) for g in gpus]
        self._last_gpus, self._last_ids = gpus, ids
        return ids

    def _gpu_id(self, r: GpuKey) -> int:
        key = (r.host, r.uuid, -1 if r.mig_instance is None else r.mig_instance)
        found = self._gpu_ids.get(key)
        if found is None:
            self.db.execute(
                "INSERT INTO gpus (host, uuid, mig_instance, gpu_index, name, sku) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (host, uuid, mig_instance) DO UPDATE SET gpu_index = excluded.gpu_index, "
                "name = excluded.name, sku = excluded.sku",
                (*key, r.gpu_index, r.name, r.sku),
            )
            found = self._gpu_ids[key] = self.db.execute(
                "SELECT gpu_id FROM gpus WHERE host = ? AND uuid = ? AND mig_instance = ?", key
            ).fetchone()[0]
            self._id_of[_GPU_KEY(r)] = found
        return found
