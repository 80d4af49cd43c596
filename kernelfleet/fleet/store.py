"""The embedded store: SQLite in WAL mode, raw windows plus 1-minute and 1-hour rollups.

Each batch is one transaction, so a crash loses at most the batch being written.
Rollups hold sums (value × seconds, and the seconds that had a value), so their
averages are exactly time-weighted; a minute is rolled up from the raw rows when
a batch of a later minute arrives (set-based SQL, not one upsert per row, which
is what lets the store take 50,000 rows a second on two cores), hours from
minutes. Retention is enforced by :meth:`Store.enforce_retention`, which the agent calls.

Readers never delay the writer: the writer (the agent's loop) has a connection of its own, and
every reading thread gets its own read-only connection, so in WAL mode a long job report neither
waits for a window's transaction nor holds one up. A read is one snapshot (one read transaction),
and it writes nothing: the minute still open (after ``rolled_until``) is summed from the raw rows
as it is read, so a rollup read mid-minute shows what has arrived and is never frozen there.
"""

from __future__ import annotations

import functools
import operator
import os
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

from kernelfleet.errors import UsageError

T = TypeVar("T")
SCHEMA_VERSION = 1
# Columns kept for every window: name in the store -> name in the row given to write().
METRICS = ("ofu", "tensor_active", "sm_clock_hertz", "sm_active", "sm_occupancy", "dram_bandwidth", "power_watts")
RESOLUTIONS = {"1m": 60, "1h": 3600}

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gpus (
    gpu_id INTEGER PRIMARY KEY,
    host TEXT NOT NULL, uuid TEXT NOT NULL, mig_instance INTEGER NOT NULL DEFAULT -1,
    gpu_index INTEGER NOT NULL, name TEXT NOT NULL, sku TEXT,
    UNIQUE (host, uuid, mig_instance)
);
CREATE TABLE IF NOT EXISTS samples (
    gpu_id INTEGER NOT NULL, ts REAL NOT NULL, window_seconds REAL NOT NULL,
    {", ".join(f"{m} REAL" for m in METRICS)},
    bottleneck TEXT NOT NULL, stale INTEGER NOT NULL,
    PRIMARY KEY (ts, gpu_id)
) WITHOUT ROWID;
-- Keyed by time, a batch appends at the end of the table (2.6x the insert rate of a
-- GPU-first key on this VM); this index serves per-GPU series.
CREATE INDEX IF NOT EXISTS samples_gpu ON samples (gpu_id, ts);
""" + "".join(
    f"""
CREATE TABLE IF NOT EXISTS rollup_{name} (
    gpu_id INTEGER NOT NULL, bucket INTEGER NOT NULL, seconds REAL NOT NULL, stale_seconds REAL NOT NULL,
    {", ".join(f"{m}_sum REAL NOT NULL, {m}_seconds REAL NOT NULL" for m in METRICS)},
    PRIMARY KEY (gpu_id, bucket)
) WITHOUT ROWID;
"""
    for name in RESOLUTIONS
) + """
CREATE TABLE IF NOT EXISTS fleet_1m (
    bucket INTEGER PRIMARY KEY, gpus INTEGER NOT NULL, ofu_sum REAL NOT NULL, ofu_seconds REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS job_windows (
    job TEXT NOT NULL, kind TEXT NOT NULL, user TEXT, gpu_id INTEGER NOT NULL, ts REAL NOT NULL,
    share REAL NOT NULL, approximate INTEGER NOT NULL,
    PRIMARY KEY (job, gpu_id, ts)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_windows_ts ON job_windows (ts);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL, gpu_id INTEGER, job TEXT, detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
"""


# One row per GPU and minute from raw windows, in rollup_1m's columns: what a minute's rollup holds.
_MINUTE_SUMS = ", ".join(
    f"SUM(COALESCE({m} * window_seconds, 0)) AS {m}_sum, "
    f"SUM(CASE WHEN {m} IS NULL THEN 0 ELSE window_seconds END) AS {m}_seconds" for m in METRICS)
_MINUTES = (f"SELECT gpu_id, CAST(ts / 60 AS INTEGER) * 60 AS bucket, SUM(window_seconds) AS seconds, "
            f"SUM(stale * window_seconds) AS stale_seconds, {_MINUTE_SUMS} FROM samples WHERE ts >= ? AND ts < ? "
            "GROUP BY 1, 2")
_OPEN = 2.0**62  # the end of "every raw row from rolled_until on"


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
    raw_seconds: float = 24 * 3600
    minute_seconds: float = 30 * 24 * 3600
    hour_seconds: float = 400 * 24 * 3600


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
        self._writer_lock = _WriterLock(self.path) if writer else None
        self.retention = retention
        self.clock = clock
        self._readers = threading.local()
        self._readers_lock = threading.Lock()
        self._reader_connections: list[sqlite3.Connection] = []
        try:
            self._open()
        except BaseException:
            if self._writer_lock is not None:
                self._writer_lock.release()
            raise

    def _open(self) -> None:
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            # The per-GPU index takes a batch's rows in as many places as there are GPUs:
            # a 64 MiB page cache keeps those pages resident instead of re-reading them.
            self.db.execute("PRAGMA cache_size=-65536")
            version = self._version()
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{self.path}: not a kernelfleet store ({exc})") from exc
        if version is not None and version > SCHEMA_VERSION:
            raise UsageError(f"{self.path}: written by a newer kernelfleet (schema {version}, this one reads {SCHEMA_VERSION})")
        self.db.executescript(_SCHEMA)
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        rolled = self.db.execute("SELECT value FROM meta WHERE key='rolled_until'").fetchone()
        self._rolled_until: int | None = int(rolled[0]) if rolled else None
        self._gpu_ids: dict[tuple[str, str, int], int] = {}

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

    @_locked
    def close(self) -> None:
        with self._readers_lock:
            for db in self._reader_connections:
                db.close()
        self.db.close()
        if self._writer_lock is not None:
            self._writer_lock.release()

    # -- writing -------------------------------------------------------------------
    @_locked
    def write(self, rows: Sequence[GpuRow]) -> None:
        """Write one batch of raw rows in one transaction; roll up the minutes it closed."""
        if not rows:
            return
        with _transaction(self.db):
            self.db.executemany(
                f"INSERT OR REPLACE INTO samples VALUES (?, ?, ?, {', '.join('?' for _ in METRICS)}, ?, ?)",
                [(self._gpu_id(r), *_ROW_VALUES(r)) for r in rows],
            )
            minute = _floor(max(r.ts for r in rows), 60)
            if self._rolled_until is None:
                self._rolled_until = _floor(min(r.ts for r in rows), 60)
            if minute > self._rolled_until:
                self._roll(self._rolled_until, minute)

    def _roll(self, start: int, end: int) -> None:
        """Recompute the minute buckets in [start, end) from raw rows, and the hours they touch.

        Buckets are recomputed, not added to, so rolling a bucket twice (a minute
        that was still open, or after a crash) gives the same rollup.
        """
        self.db.execute(f"INSERT OR REPLACE INTO rollup_1m {_MINUTES}", (start, end))
        # The fleet line of the dashboard reads one row a minute, not one per GPU a minute.
        self.db.execute(
            "INSERT OR REPLACE INTO fleet_1m SELECT bucket, COUNT(*), SUM(ofu_sum), SUM(ofu_seconds) FROM rollup_1m "
            "WHERE bucket >= ? AND bucket < ? GROUP BY bucket", (start, end),
        )
        hour_sums = ", ".join(f"SUM({m}_sum), SUM({m}_seconds)" for m in METRICS)
        self.db.execute(
            f"INSERT OR REPLACE INTO rollup_1h SELECT gpu_id, CAST(bucket / 3600 AS INTEGER) * 3600, SUM(seconds), "
            f"SUM(stale_seconds), {hour_sums} FROM rollup_1m WHERE bucket >= ? AND bucket < ? GROUP BY 1, 2",
            (_floor(start, 3600), _floor(end - 1, 3600) + 3600),
        )
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rolled_until', ?)", (str(end),))
        self._rolled_until = end

    @_locked
    def write_jobs(self, rows: Sequence[JobRow]) -> None:
        """Record which jobs held which GPUs in a window (after :meth:`write` of that window)."""
        if not rows:
            return
        ids = [self._gpu_ids[(r.host, r.uuid, -1 if r.mig_instance is None else r.mig_instance)] for r in rows]
        with _transaction(self.db):
            self.db.executemany(
                "INSERT OR REPLACE INTO job_windows VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(r.job, r.kind, r.user, i, r.ts, r.share, int(r.approximate)) for i, r in zip(ids, rows)],
            )

    @_reading
    def fleet_series(self, db: sqlite3.Connection, start: float, end: float) -> list[dict[str, float | None]]:
        """Fleet-wide time-weighted OFU per minute, with how many GPUs reported in it (the open
        minute summed from its raw rows as they stand)."""
        rolled = _rolled_until(db)
        rows = db.execute(
            "SELECT bucket, ofu_sum / NULLIF(ofu_seconds, 0), gpus FROM ("
            "SELECT bucket, gpus, ofu_sum, ofu_seconds FROM fleet_1m WHERE bucket < ? UNION ALL "
            f"SELECT bucket, COUNT(*), SUM(ofu_sum), SUM(ofu_seconds) FROM ({_MINUTES}) GROUP BY bucket"
            ") WHERE bucket >= ? AND bucket <= ? ORDER BY bucket", (rolled, rolled, _OPEN, start - 60, end))
        return [{"ts": ts, "ofu": ofu, "gpus": n} for ts, ofu, n in rows]

    @_reading
    def jobs(self, db: sqlite3.Connection, limit: int | None = None) -> list[str]:
        return [row[0] for row in db.execute("SELECT DISTINCT job FROM job_windows ORDER BY job LIMIT ?",
                                             (_limit(limit),))]

    @_reading
    def job_summaries(self, db: sqlite3.Connection, since: float, limit: int | None = None) -> list[dict[str, object]]:
        """Every job seen since ``since``: its GPUs and share-weighted OFU, least efficient first."""
        rows = db.execute(
            "SELECT j.job, MAX(j.kind), COUNT(DISTINCT j.gpu_id), "
            "SUM(s.ofu * j.share * s.window_seconds) / NULLIF(SUM(CASE WHEN s.ofu IS NULL THEN 0 "
            "ELSE j.share * s.window_seconds END), 0) AS ofu "
            "FROM job_windows j JOIN samples s ON s.gpu_id = j.gpu_id AND s.ts = j.ts "
            "WHERE j.ts >= ? GROUP BY j.job ORDER BY ofu IS NULL, ofu LIMIT ?", (since, _limit(limit)))
        return [{"job": j, "kind": k, "gpus": n, "ofu_ratio": o} for j, k, n, o in rows]

    @_reading
    def job_report(self, db: sqlite3.Connection, job: str) -> dict[str, object] | None:
        """A job's OFU per GPU over its lifetime, its bottleneck classes, timeline and events."""
        first = db.execute("SELECT MIN(ts), MAX(ts), MAX(kind), MAX(user) FROM job_windows WHERE job = ?", (job,)).fetchone()
        if first[0] is None:
            return None
        per_gpu = [
            {"host": h, "uuid": u, "mig_instance": None if mig < 0 else mig, "gpu_index": i, "name": n,
             "ofu_ratio": ofu, "seconds": secs, "mean_share": share, "approximate": bool(approx)}
            for h, u, mig, i, n, ofu, secs, share, approx in db.execute(
                "SELECT g.host, g.uuid, g.mig_instance, g.gpu_index, g.name, "
                "SUM(s.ofu * s.window_seconds) / NULLIF(SUM(CASE WHEN s.ofu IS NULL THEN 0 ELSE s.window_seconds END), 0), "
                "SUM(s.window_seconds), AVG(j.share), MAX(j.approximate) "
                "FROM job_windows j JOIN samples s ON s.gpu_id = j.gpu_id AND s.ts = j.ts JOIN gpus g ON g.gpu_id = j.gpu_id "
                "WHERE j.job = ? GROUP BY j.gpu_id ORDER BY g.host, g.gpu_index", (job,))
        ]
        classes = dict(db.execute(
            "SELECT s.bottleneck, SUM(s.window_seconds) FROM job_windows j JOIN samples s "
            "ON s.gpu_id = j.gpu_id AND s.ts = j.ts WHERE j.job = ? GROUP BY 1 ORDER BY 2 DESC", (job,)))
        timeline = [
            {"ts": ts, "ofu_ratio": ofu} for ts, ofu in db.execute(
                "SELECT CAST(s.ts / 60 AS INTEGER) * 60, "
                "SUM(s.ofu * j.share * s.window_seconds) / NULLIF(SUM(j.share * s.window_seconds), 0) "
                "FROM job_windows j JOIN samples s ON s.gpu_id = j.gpu_id AND s.ts = j.ts "
                "WHERE j.job = ? AND s.ofu IS NOT NULL GROUP BY 1 ORDER BY 1", (job,))
        ]
        return {"job": job, "kind": first[2], "user": first[3], "first_seen": first[0], "last_seen": first[1],
                "gpus": per_gpu, "bottleneck_seconds": classes, "timeline_1m": timeline,
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
        """Drop raw rows and rollup buckets older than their retention."""
        now = self.clock() if now is None else now
        with _transaction(self.db):
            self.db.execute("DELETE FROM samples WHERE ts < ?", (now - self.retention.raw_seconds,))
            self.db.execute("DELETE FROM job_windows WHERE ts < ?", (now - self.retention.raw_seconds,))
            self.db.execute("DELETE FROM rollup_1m WHERE bucket < ?", (now - self.retention.minute_seconds,))
            self.db.execute("DELETE FROM fleet_1m WHERE bucket < ?", (now - self.retention.minute_seconds,))
            self.db.execute("DELETE FROM rollup_1h WHERE bucket < ?", (now - self.retention.hour_seconds,))
            self.db.execute("DELETE FROM events WHERE ts < ?", (now - self.retention.hour_seconds,))

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
            cols = ", ".join(f"s.{m}" for m in metrics)
            cur = db.execute(
                f"SELECT s.ts, {cols} FROM samples s JOIN gpus g USING (gpu_id) "
                "WHERE g.uuid = ? AND s.ts >= ? AND s.ts <= ? ORDER BY s.ts LIMIT ?",
                (uuid, start, end, _limit(limit)),
            )
        elif resolution in RESOLUTIONS:
            seconds = RESOLUTIONS[resolution]
            rolled = _rolled_until(db)
            sums = ", ".join(f"SUM({m}_sum) AS {m}_sum, SUM({m}_seconds) AS {m}_seconds" for m in METRICS)
            columns = ", ".join(f"{m}_sum, {m}_seconds" for m in METRICS)
            cols = ", ".join(f"CASE WHEN r.{m}_seconds > 0 THEN r.{m}_sum / r.{m}_seconds END" for m in metrics)
            # rolled buckets, and the open minutes added into theirs (a rollup holds rolled minutes only)
            cur = db.execute(
                f"SELECT r.bucket, {cols} FROM (SELECT gpu_id, CAST(bucket / {seconds} AS INTEGER) * {seconds} AS bucket, "
                f"{sums} FROM (SELECT gpu_id, bucket, {columns} FROM rollup_{resolution} WHERE bucket < ? UNION ALL "
                f"SELECT gpu_id, bucket, {columns} FROM ({_MINUTES})) GROUP BY 1, 2) r JOIN gpus g USING (gpu_id) "
                "WHERE g.uuid = ? AND r.bucket >= ? AND r.bucket <= ? ORDER BY r.bucket LIMIT ?",
                (rolled if resolution == "1m" else _OPEN, rolled, _OPEN, uuid, start - seconds, end,
                 _limit(limit)),
            )
        else:
            raise UsageError(f"resolution must be raw, 1m or 1h, got {resolution!r}")
        return [dict(zip(("ts", *metrics), row)) for row in cur]


def _limit(limit: int | None) -> int:
    """SQLite's LIMIT for ``limit`` rows (-1: every row)."""
    return -1 if limit is None else limit


def _rolled_until(db: sqlite3.Connection) -> float:
    """Where the rolled minutes end, as this snapshot sees it (before the first roll: nothing rolled)."""
    row = db.execute("SELECT value FROM meta WHERE key='rolled_until'").fetchone()
    return float(row[0]) if row else float("-inf")


_ROW_VALUES = operator.attrgetter("ts", "window_seconds", *METRICS, "bottleneck", "stale")


def _floor(ts: float, seconds: int) -> int:
    return int(ts // seconds) * seconds


class _transaction:
    """BEGIN ... COMMIT on an autocommit connection; ROLLBACK on error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN")

    def __exit__(self, kind: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if kind else "COMMIT")


class _WriterLock:
    """An exclusive ``flock`` on ``STORE.lock`` for the life of the writer, holding who took it.

    The kernel drops the lock when the process dies (kill -9 included), so a crash never leaves a
    store locked; the file's text only says who holds it now.
    """

    def __init__(self, store: Path) -> None:
        import fcntl

        self.path = store.with_name(store.name + ".lock")
        try:
            self._file = open(self.path, "a+")
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot open the store's lock file ({exc.strerror})") from exc
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise UsageError(f"{store}: another agent writes this store ({holder}); stop it, or give this one "
                             "--store OTHER.db") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}\n")
        self._file.flush()

    def release(self) -> None:
        self._file.close()  # closing the descriptor releases the flock
