"""The embedded store: SQLite in WAL mode, raw windows, holds of GPUs by jobs, and rollups per GPU,
fleet and job at 1 minute and 1 hour (the schema and why it has that shape: store_schema.py).

A window batch is one transaction (its samples and its jobs together), so a crash loses at most the
batch being written. Rollups hold sums (value x seconds, and the seconds that had a value), so their
averages are exactly time-weighted; a minute is rolled up from the raw rows (set-based SQL, not one
upsert per row) in the transaction of the first batch of a later minute, hours from minutes.
Retention (:meth:`Store.enforce_retention`, which the agent calls) keeps raw windows for a day,
minute rollups for 30 days and hour rollups for 400, and then holds the file to a budget in bytes
by dropping the oldest raw windows, then the oldest minutes, then the oldest hours.

Readers never delay the writer: the writer (the agent's loop) has a connection of its own, and
every reading thread gets its own read-only connection, so in WAL mode a long job report neither
waits for a window's transaction nor holds one up. A read is one snapshot (one read transaction),
and it writes nothing: the minute still open (after ``rolled_until``) is summed from the raw rows
as it is read, so a rollup read mid-minute shows what has arrived and is never frozen there.
"""

from __future__ import annotations

import functools
import math
import operator
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kernelfleet.errors import UsageError
from kernelfleet.fleet import store_schema
from kernelfleet.fleet.store_lock import WriterLock, transaction
from kernelfleet.fleet.store_schema import (
    BOTTLENECKS,
    IN_SPAN,
    JOB_SUMS,
    KEY,
    METRICS,
    OPEN,
    RESOLUTIONS,
    SCHEMA_VERSION,
    span,
)

T = TypeVar("T")
_MINUTES = store_schema.minutes()  # every GPU's minutes in a span
_CODES = {name: i for i, name in enumerate(BOTTLENECKS)}


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One window of one GPU as the store keeps it (the agent builds these from Samples)."""

    host: str
    uuid: str
    mig_instance: int | None
    gpu_index: int
    name: str
    sku: str | None
    ts: float
    window_seconds: float
    bottleneck: str
    stale: bool
    ofu: float | None
    tensor_active: float | None
    sm_clock_hertz: float | None
    sm_active: float | None
    sm_occupancy: float | None
    dram_bandwidth: float | None
    power_watts: float | None


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job's hold on one GPU in one window; ``share`` < 1 when the GPU was shared."""

    job: str
    kind: str
    user: str | None
    host: str
    uuid: str
    mig_instance: int | None
    ts: float
    share: float
    approximate: bool


@dataclass(frozen=True, slots=True)
class Retention:
    """How long each resolution is kept, and the most bytes the store's file may hold (past it the
    oldest raw windows go first, then the oldest minutes, then the oldest hours)."""

    raw_seconds: float = 24 * 3600
    minute_seconds: float = 30 * 24 * 3600
    hour_seconds: float = 400 * 24 * 3600
    budget_bytes: int = 5 * 10**9


# What the budget may never take: the last hour of raw windows, day of minutes, week of hours.
# (table, how to find its oldest and newest time, the floor, the tables cut with it)
_BUDGET_FLOORS = (
    ("samples", "SELECT (SELECT ts FROM samples ORDER BY key LIMIT 1), (SELECT ts FROM samples ORDER BY key DESC LIMIT 1)",
     3600.0, ()),
    ("rollup_1m", "SELECT MIN(bucket), MAX(bucket) FROM rollup_1m", 86400.0, ("rollup_1m", "fleet_1m", "job_1m")),
    ("rollup_1h", "SELECT MIN(bucket), MAX(bucket) FROM rollup_1h", 7 * 86400.0, ("rollup_1h", "job_1h")),
)
# ?1 gpu_id, ?2 ts, ?3 window_seconds, the metrics, bottleneck, stale; the key made of ?2 and ?1
_INSERT_SAMPLE = (f"INSERT OR REPLACE INTO samples VALUES ({KEY.replace(':ts', '?2').replace(':gpu_id', '?1')}, "
                  f"{', '.join(f'?{i}' for i in range(1, 6 + len(METRICS)))})")


def _locked(method: Callable[..., T]) -> Callable[..., T]:
    """The writer's connection serves one writing call at a time."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: object, **kwargs: object) -> T:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _reading(method: Callable[..., T]) -> Callable[..., T]:
    """Run a read on this thread's own read-only connection, as one snapshot; never the writer's lock."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: object, **kwargs: object) -> T:
        db = self._reader()
        if db.in_transaction:  # a read inside a read (the job report's events): the same snapshot
            return method(self, db, *args, **kwargs)
        db.execute("BEGIN")
        try:
            return method(self, db, *args, **kwargs)
        finally:
            db.execute("COMMIT")

    return wrapper


class Store:
    """One SQLite file; safe to use from several threads, and to read from other processes."""

    def __init__(self, path: str | Path, retention: Retention = Retention(), clock: Callable[[], float] = time.time,
                 writer: bool = False):
        self.path = Path(path)
        self._lock = threading.RLock()
        # One writer per store: two agents on one file write rollups that diverge. Readers (the job
        # report, a second dashboard) take no lock; SQLite's WAL lets them read beside the writer.
        self._writer_lock = WriterLock(self.path) if writer else None
        self.retention = retention
        self.clock = clock
        self._readers = threading.local()
        self._readers_lock = threading.Lock()
        self._reader_connections: list[sqlite3.Connection] = []
        self._gpu_ids: dict[tuple[str, str, int], int] = {}
        self._job_ids: dict[str, tuple[int, str, str | None]] = {}
        # The holds this writer has open: gpu_id -> job_id -> (share, approximate), and where each
        # began. A hold's end reaches the file when it closes, not at every window.
        self._holds: dict[int, dict[int, tuple[float, bool]]] = {}
        self._since: dict[tuple[int, int], float] = {}
        self._newest: dict[int, float] = {}  # each GPU's newest window written here
        self._holds_adopted = False
        try:
            self._open()
        except BaseException:
            if self._writer_lock is not None:
                self._writer_lock.release()
            raise

    def _open(self) -> None:
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
            empty = self.db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
            if empty:  # only a file without tables takes it: deleted rows then give their pages back
                self.db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA cache_size=-65536")
            self.db.execute("PRAGMA journal_size_limit=67108864")  # the WAL shrinks back after a checkpoint
            self.db.execute("BEGIN IMMEDIATE")  # one process migrates; another opening meanwhile waits
            version = self._version()
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{self.path}: not a kernelfleet store ({exc})") from exc
        try:
            if version is not None and version > SCHEMA_VERSION:
                raise UsageError(f"{self.path}: written by a newer kernelfleet (schema {version}, this one reads "
                                 f"{SCHEMA_VERSION})")
            if version == 1:
                store_schema.migrate_v1(self.db)
            store_schema.create(self.db)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            rolled = self.db.execute("SELECT value FROM meta WHERE key='rolled_until'").fetchone()
            self._rolled_until: int | None = int(rolled[0]) if rolled else None
            if version == 1 and self._rolled_until is not None:
                self._migrated_rollups(self._rolled_until)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            self.db.close()
            raise

    def _migrated_rollups(self, rolled: int) -> None:
        """The job rollups version 1 had not; its hour of the open hour (v1 rolled hours every minute)
        gives way to that hour's minutes, as in version 2."""
        hour = _floor(rolled, 3600)
        self.db.execute("DELETE FROM rollup_1h WHERE bucket >= ?", (hour,))
        first = self.db.execute("SELECT ts FROM samples ORDER BY key LIMIT 1").fetchone()
        if first is not None:
            self.db.execute(f"INSERT OR REPLACE INTO job_1m {_JOB_MINUTES}", span(_floor(first[0], 60), rolled))
            self._roll_hours(_floor(first[0], 3600), hour, gpus=False)

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only connection (made at its first read)."""
        db = getattr(self._readers, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
            db.execute("PRAGMA query_only = ON")
            self._readers.db = db
            with self._readers_lock:  # not the writer's lock: a reader never waits for the writer
                self._reader_connections.append(db)
        return db

    def _version(self) -> int | None:
        has_meta = self.db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        if not has_meta:
            return None
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else None

    def close(self) -> None:
        with self._lock:
            with self._readers_lock:
                for db in self._reader_connections:
                    db.close()
            with transaction(self.db):  # a clean stop ends the open holds at their last windows
                for gpu, spans in self._holds.items():
                    for job_id in spans:
                        self._close_hold(gpu, job_id, self._newest[gpu])
            self._holds.clear()
            self.db.close()
            if self._writer_lock is not None:
                self._writer_lock.release()

    # -- writing -------------------------------------------------------------------
    @_locked
    def write(self, rows: Sequence[GpuRow], jobs: Sequence[JobRow] = ()) -> None:
        """Write one window batch in one transaction: its raw rows, and which jobs held its GPUs
        (``jobs``, for GPUs among ``rows``); roll up the minutes it closed."""
        if not rows:
            return
        with transaction(self.db):
            if not self._holds_adopted:
                # holds a writer before this one left open (a crash) end at the newest window on file
                self.db.execute("UPDATE holds SET until = MAX(since, COALESCE((SELECT ts FROM samples ORDER BY key DESC "
                                "LIMIT 1), since)) WHERE until = ?", (OPEN,))
                self._holds_adopted = True
            ids = [self._gpu_id(r) for r in rows]
            self.db.executemany(_INSERT_SAMPLE, [(i, *_ROW_VALUES(r), _CODES.get(r.bottleneck, _UNKNOWN), r.stale)
                                                 for i, r in zip(ids, rows)])
            self._hold(ids, rows, jobs)
            minute = _floor(max(r.ts for r in rows), 60)
            if self._rolled_until is None:
                # Nothing rolled yet: start at the oldest window on file, not this batch's. A first
                # writer stopped (or killed) before its first minute closed left windows behind that
                # the next writer would otherwise never roll (the fault campaign found it).
                oldest = self.db.execute("SELECT ts FROM samples ORDER BY key LIMIT 1").fetchone()[0]
                self._rolled_until = _floor(oldest, 60)  # this batch is on file already
            if minute > self._rolled_until:
                self._roll(self._rolled_until, minute)

    def _hold(self, ids: Sequence[int], rows: Sequence[GpuRow], jobs: Sequence[JobRow]) -> None:
        """Open or close the holds of the batch's GPUs where their jobs changed. A window no newer
        than its GPU's newest (late, or written again) changes no hold."""
        held: dict[int, dict[int, tuple[float, bool]]] = {}
        for j in jobs:
            gpu = self._gpu_ids[(j.host, j.uuid, -1 if j.mig_instance is None else j.mig_instance)]
            held.setdefault(gpu, {})[self._job_id(j)] = (j.share, j.approximate)
        for gpu, r in zip(ids, rows):
            last = self._newest.get(gpu)
            if last is not None and r.ts <= last:
                continue
            self._newest[gpu] = r.ts
            now, spans = held.get(gpu, _NONE), self._holds.get(gpu, _NONE)
            if now == spans:  # the same jobs at the same shares: every open hold goes on, in memory
                continue
            for job_id, kept in spans.items():
                if now.get(job_id) != kept:
                    self._close_hold(gpu, job_id, last)
            for job_id, (share, approximate) in now.items():
                if spans.get(job_id) != (share, approximate):
                    self.db.execute("INSERT OR REPLACE INTO holds VALUES (?, ?, ?, ?, ?, ?)",
                                    (job_id, gpu, r.ts, OPEN, share, int(approximate)))
                    self._since[gpu, job_id] = r.ts
            self._holds[gpu] = now

    def _close_hold(self, gpu: int, job_id: int, until: float) -> None:
        self.db.execute("UPDATE holds SET until = ? WHERE gpu_id = ? AND since = ? AND job_id = ?",
                        (until, gpu, self._since.pop((gpu, job_id)), job_id))

    def _job_id(self, j: JobRow) -> int:
        found = self._job_ids.get(j.job)
        if found is None or found[1] != j.kind or found[2] != j.user:
            self.db.execute("INSERT INTO jobs (name, kind, user) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                            "kind = excluded.kind, user = COALESCE(excluded.user, user)", (j.job, j.kind, j.user))
            job_id = self.db.execute("SELECT job_id FROM jobs WHERE name = ?", (j.job,)).fetchone()[0]
            found = self._job_ids[j.job] = (job_id, j.kind, j.user)
        return found[0]

    def _roll(self, start: int, end: int) -> None:
        """Recompute the minute buckets in [start, end) from raw rows and holds, and the hours that
        closed with them.

        Buckets are recomputed, not added to, so rolling a bucket twice (after a crash) gives the
        same rollup. An hour is rolled once, when it closes: until then its rolled minutes stand in
        for it (rolling it every minute cost more than the minute itself).
        """
        params = span(start, end)
        self.db.execute(f"INSERT OR REPLACE INTO rollup_1m {_MINUTES}", params)
        # The fleet line of the dashboard reads one row a minute, not one per GPU a minute.
        self.db.execute(
            "INSERT OR REPLACE INTO fleet_1m SELECT bucket, COUNT(*), SUM(ofu_sum), SUM(ofu_seconds) FROM rollup_1m "
            "WHERE bucket >= ? AND bucket < ? GROUP BY bucket", (start, end),
        )
        self.db.execute(f"INSERT OR REPLACE INTO job_1m {_JOB_MINUTES}", params)
        if _floor(end, 3600) > _floor(start, 3600):
            self._roll_hours(_floor(start, 3600), _floor(end, 3600))
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rolled_until', ?)", (str(end),))
        self._rolled_until = end

    def _roll_hours(self, start: int, end: int, gpus: bool = True) -> None:
        """The hour buckets in [start, end) from their minutes: of every GPU (``gpus``) and job."""
        hour = "CAST(bucket / 3600 AS INTEGER) * 3600"
        if gpus:
            sums = ", ".join(f"SUM({m}_sum), SUM({m}_seconds)" for m in METRICS)
            self.db.execute(f"INSERT OR REPLACE INTO rollup_1h SELECT gpu_id, {hour}, SUM(seconds), SUM(stale_seconds), "
                            f"{sums} FROM rollup_1m WHERE bucket >= ? AND bucket < ? GROUP BY 1, 2", (start, end))
        self.db.execute(f"INSERT OR REPLACE INTO job_1h SELECT job_id, {hour}, gpu_id, {_JOB_ROLLUP_SUMS} FROM job_1m "
                        "WHERE bucket >= ? AND bucket < ? GROUP BY 1, 2, 3", (start, end))

    @_locked
    def add_event(self, ts: float, kind: str, detail: str, gpu_uuid: str | None = None, job: str | None = None) -> None:
        gpu_id = None
        if gpu_uuid is not None:
            found = self.db.execute("SELECT gpu_id FROM gpus WHERE uuid = ?", (gpu_uuid,)).fetchone()
            gpu_id = found[0] if found else None
        self.db.execute("INSERT INTO events (ts, kind, gpu_id, job, detail) VALUES (?, ?, ?, ?, ?)",
                        (ts, kind, gpu_id, job, detail))

    def _gpu_id(self, r: GpuRow) -> int:
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
        return found

    @_locked
    def enforce_retention(self, now: float | None = None) -> None:
        """Drop raw rows, holds and rollup buckets older than their retention; then, while the file
        holds more than the budget, the oldest raw windows, minutes and hours."""
        now = self.clock() if now is None else now
        r = self.retention
        with transaction(self.db):
            self.db.execute("DELETE FROM samples WHERE key < ?", (span(now - r.raw_seconds, OPEN)["lo_key"],))
            for table in ("rollup_1m", "fleet_1m", "job_1m"):
                self.db.execute(f"DELETE FROM {table} WHERE bucket < ?", (now - r.minute_seconds,))
            for table in ("rollup_1h", "job_1h"):
                self.db.execute(f"DELETE FROM {table} WHERE bucket < ?", (now - r.hour_seconds,))
            # a hold names its job for as long as its hours are kept; a job with no hold left is gone
            self.db.execute("DELETE FROM holds WHERE until < ?", (now - r.hour_seconds,))
            if self.db.execute("DELETE FROM jobs WHERE job_id NOT IN (SELECT job_id FROM holds)").rowcount:
                self._job_ids.clear()
            self.db.execute("DELETE FROM events WHERE ts < ?", (now - r.hour_seconds,))
            self._fit_budget()
        # Every free page back to the file (a no-op on a store made before auto_vacuum was set):
        # executescript steps the pragma to its end, where execute frees one page a call.
        self.db.executescript("PRAGMA incremental_vacuum;")
        self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")  # the file shrinks when the WAL is written back

    def used_bytes(self) -> int:
        """Bytes the store's pages hold (the file less its free pages; the WAL beside it not counted)."""
        pages, free, size = (self.db.execute(f"PRAGMA {p}").fetchone()[0]
                             for p in ("page_count", "freelist_count", "page_size"))
        return (pages - free) * size

    def _fit_budget(self) -> None:
        for table, ends, floor_seconds, alongside in _BUDGET_FLOORS:
            while self.used_bytes() > self.retention.budget_bytes:
                low, high = self.db.execute(ends).fetchone()
                if low is None or high - low <= floor_seconds + 60:
                    break
                cut = low + (high - low - floor_seconds) / 2  # halve what is over the floor, and look again
                if table == "samples":
                    self.db.execute("DELETE FROM samples WHERE key < ?", (span(cut, OPEN)["lo_key"],))
                for name in alongside:  # rollups: the table itself is among them
                    self.db.execute(f"DELETE FROM {name} WHERE bucket < ?", (cut,))

    # -- reading -------------------------------------------------------------------
    @_reading
    def gpus(self, db: sqlite3.Connection) -> list[dict[str, object]]:
        cur = db.execute("SELECT host, uuid, mig_instance, gpu_index, name, sku FROM gpus ORDER BY host, gpu_index, mig_instance")
        return [
            {"host": h, "uuid": u, "mig_instance": None if mig < 0 else mig, "gpu_index": i, "name": n, "sku": s}
            for h, u, mig, i, n, s in cur
        ]

    @_reading
    def series(self, db: sqlite3.Connection, uuid: str, start: float, end: float, resolution: str = "raw",
               metrics: Iterable[str] = ("ofu",), limit: int | None = None) -> list[dict[str, float | None]]:
        """Points of one GPU between ``start`` and ``end``: raw windows or time-weighted rollups (the
        open minute, and its hour, summed from the raw rows as they stand); the first ``limit``."""
        metrics = tuple(metrics)
        unknown = set(metrics) - set(METRICS)
        if unknown:
            raise UsageError(f"unknown metric(s) {sorted(unknown)}; known: {', '.join(METRICS)}")
        if resolution == "raw":
            cur = db.execute(f"SELECT s.ts, {', '.join(f's.{m}' for m in metrics)} FROM samples s WHERE {IN_SPAN} AND "
                             f"s.gpu_id IN ({_OF_UUID}) ORDER BY s.key LIMIT :limit",
                             {**span(start, math.nextafter(end, math.inf)), "uuid": uuid, "limit": _limit(limit)})
        elif resolution in RESOLUTIONS:
            seconds = RESOLUTIONS[resolution]
            columns = ", ".join(f"{m}_sum, {m}_seconds" for m in METRICS)
            sums = ", ".join(f"SUM({m}_sum) AS {m}_sum, SUM({m}_seconds) AS {m}_seconds" for m in METRICS)
            cols = ", ".join(f"CASE WHEN {m}_seconds > 0 THEN {m}_sum / {m}_seconds END" for m in metrics)
            rolled, params = _rolled(db, resolution, "rollup", f"gpu_id, bucket, {columns}", f"gpu_id IN ({_OF_UUID})",
                                     store_schema.minutes(f"AND s.gpu_id IN ({_OF_UUID})"), start - seconds, end)
            cur = db.execute(
                f"SELECT bucket, {cols} FROM (SELECT gpu_id, CAST(bucket / {seconds} AS INTEGER) * {seconds} AS bucket, "
                f"{sums} FROM ({rolled}) GROUP BY 1, 2) WHERE bucket >= :from AND bucket <= :to ORDER BY bucket "
                "LIMIT :limit", {**params, "uuid": uuid, "limit": _limit(limit)})
        else:
            raise UsageError(f"resolution must be raw, 1m or 1h, got {resolution!r}")
        return [dict(zip(("ts", *metrics), row)) for row in cur]

    @_reading
    def fleet_series(self, db: sqlite3.Connection, start: float, end: float) -> list[dict[str, float | None]]:
        """Fleet-wide time-weighted OFU per minute, with how many GPUs reported in it (the open
        minute summed from its raw rows as they stand)."""
        rolled = _rolled_until(db)
        rows = db.execute(
            "SELECT bucket, ofu_sum / NULLIF(ofu_seconds, 0), gpus FROM ("
            "SELECT bucket, gpus, ofu_sum, ofu_seconds FROM fleet_1m WHERE bucket >= :from AND bucket <= :to "
            f"AND bucket < :rolled UNION ALL SELECT bucket, COUNT(*), SUM(ofu_sum), SUM(ofu_seconds) FROM ({_MINUTES}) "
            "GROUP BY bucket) WHERE bucket >= :from AND bucket <= :to ORDER BY bucket",
            {**span(rolled, OPEN), "from": start - 60, "to": end, "rolled": rolled})
        return [{"ts": ts, "ofu": ofu, "gpus": n} for ts, ofu, n in rows]

    @_reading
    def jobs(self, db: sqlite3.Connection, limit: int | None = None) -> list[str]:
        return [row[0] for row in db.execute("SELECT name FROM jobs ORDER BY name LIMIT ?", (_limit(limit),))]

    @_reading
    def job_summaries(self, db: sqlite3.Connection, since: float, limit: int | None = None) -> list[dict[str, object]]:
        """Every job seen since the minute of ``since``: its GPUs and share-weighted OFU, least
        efficient first (from the job minute rollups, and the open minute's raw rows)."""
        rolled = _rolled_until(db)
        columns = "job_id, gpu_id, share_ofu_sum, share_ofu_seconds"
        rows = db.execute(
            "SELECT j.name, j.kind, COUNT(DISTINCT x.gpu_id), SUM(x.share_ofu_sum) / NULLIF(SUM(x.share_ofu_seconds), 0) "
            f"AS ofu FROM (SELECT {columns} FROM job_1m WHERE bucket >= :from AND bucket < :rolled UNION ALL "
            f"SELECT {columns} FROM ({_JOB_MINUTES})) x JOIN jobs j USING (job_id) "
            "GROUP BY x.job_id ORDER BY ofu IS NULL, ofu LIMIT :limit",
            {**span(rolled, OPEN), "from": _floor(since, 60), "rolled": rolled, "limit": _limit(limit)})
        return [{"job": j, "kind": k, "gpus": n, "ofu_ratio": o} for j, k, n, o in rows]

    @_reading
    def job_report(self, db: sqlite3.Connection, job: str) -> dict[str, object] | None:
        """A job's OFU per GPU over its lifetime and its bottleneck classes (from its hour rollups),
        its OFU per minute over its last day and per hour over its life, and its events."""
        found = db.execute("SELECT job_id, kind, user FROM jobs WHERE name = ?", (job,)).fetchone()
        if found is None:
            return None
        job_id, kind, user = found
        newest = db.execute("SELECT ts FROM samples ORDER BY key DESC LIMIT 1").fetchone()
        first, last = db.execute("SELECT MIN(since), MAX(CASE WHEN until = ? THEN COALESCE(?, since) ELSE until END) "
                                 "FROM holds WHERE job_id = ?", (OPEN, newest and newest[0], job_id)).fetchone()
        if first is None:
            return None
        open_minutes = store_schema.job_minutes("AND h.job_id = :job_id")

        def rows(resolution: str, columns: str, since: float) -> tuple[str, dict[str, object]]:
            sql, params = _rolled(db, resolution, "job", columns, "job_id = :job_id", open_minutes, since, OPEN)
            return sql, {**params, "job_id": job_id}

        life, params = rows("1h", f"gpu_id, bucket, {', '.join(JOB_SUMS)}", float("-inf"))
        per_gpu = [
            {"host": h, "uuid": u, "mig_instance": None if mig < 0 else mig, "gpu_index": i, "name": n,
             "ofu_ratio": ofu, "seconds": secs, "mean_share": share, "approximate": bool(approx)}
            for h, u, mig, i, n, ofu, secs, share, approx in db.execute(
                "SELECT g.host, g.uuid, g.mig_instance, g.gpu_index, g.name, SUM(x.ofu_sum) / NULLIF(SUM(x.ofu_seconds), 0), "
                f"SUM(x.seconds), SUM(x.share_sum) / SUM(x.windows), MAX(x.approximate) FROM ({life}) x "
                "JOIN gpus g USING (gpu_id) GROUP BY x.gpu_id ORDER BY g.host, g.gpu_index", params)
        ]
        classes = db.execute(f"SELECT {', '.join(f'SUM(b{i}_seconds)' for i in range(len(BOTTLENECKS)))} FROM ({life})",
                             params).fetchone()
        by_class = sorted(((name, s) for name, s in zip(BOTTLENECKS, classes) if s), key=lambda c: -c[1])

        def timeline(resolution: str, since: float) -> list[dict[str, float | None]]:
            seconds = RESOLUTIONS[resolution]
            sql, params = rows(resolution, "bucket, share_ofu_sum, share_ofu_seconds", since)
            return [{"ts": ts, "ofu_ratio": ofu} for ts, ofu in db.execute(
                f"SELECT CAST(bucket / {seconds} AS INTEGER) * {seconds} AS b, SUM(share_ofu_sum) / SUM(share_ofu_seconds) "
                f"FROM ({sql}) GROUP BY b HAVING SUM(share_ofu_seconds) > 0 ORDER BY b", params)]

        return {"job": job, "kind": kind, "user": user, "first_seen": first, "last_seen": last,
                "gpus": per_gpu, "bottleneck_seconds": dict(by_class),
                # what a chart of the job draws: its last day in minutes, its life in hours
                "timeline_1m": timeline("1m", _floor(last, 60) - 86400 + 60),
                "timeline_1h": timeline("1h", float("-inf")),
                "events": self.events(job=job)}

    @_reading
    def events(self, db: sqlite3.Connection, since: float = 0.0, job: str | None = None,
               limit: int | None = None) -> list[dict[str, object]]:
        """Events since ``since`` (of ``job``), oldest first; with ``limit``, the newest that many."""
        query = ("SELECT e.ts, e.kind, g.uuid, e.job, e.detail FROM events e LEFT JOIN gpus g USING (gpu_id) "
                 "WHERE e.ts >= ?" + (" AND e.job = ?" if job is not None else "") + " ORDER BY e.ts DESC LIMIT ?")
        params = (since, job) if job is not None else (since,)
        rows = db.execute(query, (*params, _limit(limit))).fetchall()
        return [{"ts": ts, "kind": k, "uuid": u, "job": j, "detail": d} for ts, k, u, j, d in reversed(rows)]

    @_reading
    def ofu_grid(self, db: sqlite3.Connection, start: float, end: float,
                 step_seconds: int) -> list[tuple[str, str, int, int | None, int, float | None]]:
        """Every GPU's time-weighted OFU per step in [start, end] (a dashboard heatmap): rows of
        (host, uuid, gpu_index, mig_instance, step start, OFU); a step of whole hours reads the
        hour rollups, any other the minute rollups (and the open minute from raw rows)."""
        resolution = "1h" if step_seconds % 3600 == 0 else "1m"
        sql, params = _rolled(db, resolution, "rollup", "gpu_id, bucket, ofu_sum, ofu_seconds", "1",
                              _MINUTES, _floor(start, step_seconds), end)
        rows = db.execute(
            f"SELECT g.host, g.uuid, g.gpu_index, g.mig_instance, CAST(x.bucket / {step_seconds} AS INTEGER) * "
            f"{step_seconds} AS b, SUM(x.ofu_sum) / NULLIF(SUM(x.ofu_seconds), 0) FROM ({sql}) x JOIN gpus g "
            "USING (gpu_id) GROUP BY x.gpu_id, b ORDER BY g.host, g.gpu_index, g.mig_instance, b", params)
        return [(h, u, i, None if mig < 0 else mig, b, ofu) for h, u, i, mig, b, ofu in rows]

    @_reading
    def job_seconds_below(self, db: sqlite3.Connection, job: str, ofu_ratio: float) -> dict[tuple[str, int | None], float]:
        """Per (uuid, mig_instance) the job held: its share of the seconds of the minutes whose OFU was
        below ``ofu_ratio`` (a minute without an OFU is not below). Minute rollups: the last 30 days."""
        found = db.execute("SELECT job_id FROM jobs WHERE name = ?", (job,)).fetchone()
        if found is None:
            return {}
        sql, params = _rolled(db, "1m", "job", "gpu_id, bucket, windows, seconds, share_sum, ofu_sum, ofu_seconds",
                              "job_id = :job_id", store_schema.job_minutes("AND h.job_id = :job_id"), float("-inf"), OPEN)
        rows = db.execute(
            "SELECT g.uuid, g.mig_instance, SUM(m.seconds * m.share) FROM (SELECT gpu_id, SUM(seconds) AS seconds, "
            "SUM(share_sum) / SUM(windows) AS share, SUM(ofu_sum) / NULLIF(SUM(ofu_seconds), 0) AS ofu "
            f"FROM ({sql}) GROUP BY gpu_id, bucket) m JOIN gpus g USING (gpu_id) WHERE m.ofu < :below GROUP BY m.gpu_id",
            {**params, "job_id": found[0], "below": ofu_ratio})
        return {(u, None if mig < 0 else mig): s for u, mig, s in rows}


def _rolled(db: sqlite3.Connection, resolution: str, prefix: str, columns: str, where: str, open_minutes: str,
            since: float, to: float) -> tuple[str, dict[str, float]]:
    """The rows of ``{prefix}_1m`` or ``_1h`` (``columns``, ``where``) with buckets in [since, to]
    as this snapshot sees them: for hours, the closed hours and the rolled minutes of the open one;
    then the open minutes from raw rows (``open_minutes``). Group them by the resolution's bucket."""
    rolled = _rolled_until(db)
    hour_rolled = _floor(rolled, 3600) if math.isfinite(rolled) else rolled
    minutes_from = ":hour_rolled" if resolution == "1h" else ":from"
    parts = [(f"SELECT {columns} FROM {prefix}_1h WHERE {where} AND bucket >= :from AND bucket <= :to "
             "AND bucket < :hour_rolled")] if resolution == "1h" else []
    parts += [(f"SELECT {columns} FROM {prefix}_1m WHERE {where} AND bucket >= {minutes_from} AND bucket <= :to "
              "AND bucket < :rolled"), f"SELECT {columns} FROM ({open_minutes})"]
    return " UNION ALL ".join(parts), {**span(rolled, OPEN), "from": since, "to": to, "rolled": rolled,
                                       "hour_rolled": hour_rolled}


_OF_UUID = "SELECT gpu_id FROM gpus WHERE uuid = :uuid"
_UNKNOWN = BOTTLENECKS.index("unknown")
_NONE: dict = {}  # a GPU no job holds
_JOB_MINUTES = store_schema.job_minutes()
_JOB_ROLLUP_SUMS = ", ".join(f"MAX({c})" if c == "approximate" else f"SUM({c})" for c in JOB_SUMS)


def _limit(limit: int | None) -> int:
    """SQLite's LIMIT for ``limit`` rows (-1: every row)."""
    return -1 if limit is None else limit


def _rolled_until(db: sqlite3.Connection) -> float:
    """Where the rolled minutes end, as this snapshot sees it (before the first roll: nothing rolled)."""
    row = db.execute("SELECT value FROM meta WHERE key='rolled_until'").fetchone()
    return float(row[0]) if row else float("-inf")


_ROW_VALUES = operator.attrgetter("ts", "window_seconds", *METRICS)


def _floor(ts: float, seconds: int) -> int:
    return int(ts // seconds) * seconds
