"""The embedded store: SQLite in WAL mode, raw windows, holds of GPUs by jobs, and rollups per GPU,
fleet and job at 1 minute and 1 hour (the schema and why it has that shape: store_schema.py).

This module opens the file (and migrates it) and hands each call to its concern: writing a window
batch (store_write.py) and rolling it up (store_roll.py), retention (store_retention.py), and the
reads (store_queries.py). Rollups hold sums (value x seconds, and the seconds that had a value), so
their averages are exactly time-weighted.

Readers never delay the writer: the writer (the agent's loop) has a connection of its own, and
every reading thread gets its own read-only connection, so in WAL mode a long job report neither
waits for a window's transaction nor holds one up. A read is one snapshot (one read transaction).
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from kernelfleet.errors import UsageError
from kernelfleet.fleet import store_queries, store_retention, store_roll, store_schema
from kernelfleet.fleet.store_lock import WriterLock
from kernelfleet.fleet.store_rows import Batch, GpuKey, GpuRow, Hold, JobRow, Retention
from kernelfleet.fleet.store_schema import SCHEMA_VERSION
from kernelfleet.fleet.store_write import Writer

__all__ = ["Batch", "GpuKey", "GpuRow", "Hold", "JobRow", "Retention", "Store"]
T = TypeVar("T")
_DEFAULT_RETENTION = Retention()


def _locked(method: Callable[..., T]) -> Callable[..., T]:
    """The writer's connection serves one writing call at a time."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: object, **kwargs: object) -> T:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class Store:
    """One SQLite file; safe to use from several threads, and to read from other processes."""

    def __init__(self, path: str | Path, retention: Retention = _DEFAULT_RETENTION, clock: Callable[[], float] = time.time,
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
            rolled_until = int(rolled[0]) if rolled else None
            if version == 1 and rolled_until is not None:
                store_roll.migrated_rollups(self.db, rolled_until)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            self.db.close()
            raise
        self._writer = Writer(self.db, rolled_until)

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

    def _read(self, query: Callable[..., T], *args: object) -> T:
        """Run a read on this thread's own read-only connection, as one snapshot; never the writer's lock."""
        db = self._reader()
        if db.in_transaction:  # a read inside a read: the same snapshot
            return query(db, *args)
        db.execute("BEGIN")
        try:
            return query(db, *args)
        finally:
            db.execute("COMMIT")

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
            self._writer.close_holds()  # a clean stop ends the open holds at their last windows
            self.db.close()
            if self._writer_lock is not None:
                self._writer_lock.release()

    # -- writing -------------------------------------------------------------------
    @_locked
    def write_batch(self, batch: Batch) -> None:
        """Write one window batch in one transaction: its raw rows, and which jobs held its GPUs;
        roll up the minutes it closed. (The agent's way: a batch of columns made once a window.)"""
        self._writer.write(batch)

    def write(self, rows: Sequence[GpuRow], jobs: Sequence[JobRow] = ()) -> None:
        """:meth:`write_batch` of ``rows`` and ``jobs`` (for GPUs among ``rows``) as row objects."""
        self.write_batch(Batch.of(rows, jobs))

    @_locked
    def add_event(self, ts: float, kind: str, detail: str, gpu_uuid: str | None = None, job: str | None = None) -> None:
        self._writer.add_event(ts, kind, detail, gpu_uuid, job)

    @_locked
    def enforce_retention(self, now: float | None = None) -> None:
        """Drop what is older than its retention, then hold the file to the budget in bytes."""
        if store_retention.enforce(self.db, self.retention, self.clock() if now is None else now):
            self._writer.forget_jobs()

    def used_bytes(self) -> int:
        """Bytes the store's pages hold (the file less its free pages; the WAL beside it not counted)."""
        return store_retention.used_bytes(self.db)

    # -- reading (store_queries.py) --------------------------------------------------
    def gpus(self) -> list[dict[str, object]]:
        return self._read(store_queries.gpus)

    def series(self, uuid: str, start: float, end: float, resolution: str = "raw", metrics: Iterable[str] = ("ofu",),
               limit: int | None = None) -> list[dict[str, float | None]]:
        """Points of one GPU between ``start`` and ``end``: raw windows or time-weighted rollups."""
        return self._read(store_queries.series, uuid, start, end, resolution, metrics, limit)

    def fleet_series(self, start: float, end: float) -> list[dict[str, float | None]]:
        """Fleet-wide time-weighted OFU per minute, with how many GPUs reported in it."""
        return self._read(store_queries.fleet_series, start, end)

    def jobs(self, limit: int | None = None) -> list[str]:
        return self._read(store_queries.jobs, limit)

    def job_summaries(self, since: float, limit: int | None = None) -> list[dict[str, object]]:
        """Every job seen since the minute of ``since``, least efficient first."""
        return self._read(store_queries.job_summaries, since, limit)

    def job_report(self, job: str) -> dict[str, object] | None:
        """A job's OFU per GPU, bottleneck classes, timelines and events (None: no such job)."""
        return self._read(store_queries.job_report, job)

    def events(self, since: float = 0.0, job: str | None = None, limit: int | None = None) -> list[dict[str, object]]:
        """Events since ``since`` (of ``job``), oldest first; with ``limit``, the newest that many."""
        return self._read(store_queries.events, since, job, limit)

    def ofu_grid(self, start: float, end: float, step_seconds: int) -> list[tuple[str, str, int, int | None, int, float | None]]:
        """Every GPU's time-weighted OFU per step in [start, end] (the dashboard's heatmap)."""
        return self._read(store_queries.ofu_grid, start, end, step_seconds)

    def job_seconds_below(self, job: str, ofu_ratio: float) -> dict[tuple[str, int | None], float]:
        """Per (uuid, mig_instance) the job held: its share of the seconds of minutes below ``ofu_ratio``."""
        return self._read(store_queries.job_seconds_below, job, ofu_ratio)
