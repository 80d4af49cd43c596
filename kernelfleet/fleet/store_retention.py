"""The store's retention: raw windows for a day, minute rollups for 30 days and hour rollups for
400 (by default, :class:`Retention`), then the file held to a budget in bytes by dropping the oldest
raw windows, then the oldest minutes, then the oldest hours."""

from __future__ import annotations

import sqlite3

from kernelfleet.fleet.store_lock import transaction
from kernelfleet.fleet.store_rows import Retention
from kernelfleet.fleet.store_schema import OPEN, span

# What the budget may never take: the last hour of raw windows, day of minutes, week of hours.
# (table, how to find its oldest and newest time, the floor, the tables cut with it)
_BUDGET_FLOORS = (
    ("samples", "SELECT (SELECT ts FROM samples ORDER BY key LIMIT 1), (SELECT ts FROM samples ORDER BY key DESC LIMIT 1)",
     3600.0, ()),
    ("rollup_1m", "SELECT MIN(bucket), MAX(bucket) FROM rollup_1m", 86400.0, ("rollup_1m", "fleet_1m", "job_1m")),
    ("rollup_1h", "SELECT MIN(bucket), MAX(bucket) FROM rollup_1h", 7 * 86400.0, ("rollup_1h", "job_1h")),
)
_CHECKPOINT_FREED_PAGES = 1000  # SQLite's wal_autocheckpoint default
# How often the agent enforces retention: every 10 minutes. Retention's deletes, vacuum and the
# budget's size checks took ~0.4 ms a minute at 8 GPUs (5-10 us a window, a tenth of the window's
# own write); every 10 minutes they are under 1 us a window. What it costs: data stays up to 10
# minutes past its retention, and the file up to 10 minutes of raw windows past its budget
# (~54 MB at 1,000 GPUs; ~0.4 MB at 8).
EVERY_SECONDS = 600.0


def enforce(db: sqlite3.Connection, retention: Retention, now: float) -> bool:
    """Drop raw rows, holds and rollup buckets older than their retention; then, while the file
    holds more than the budget, the oldest raw windows, minutes and hours. True when jobs went."""
    r = retention
    with transaction(db):
        db.execute("DELETE FROM samples WHERE key < ?", (span(now - r.raw_seconds, OPEN)["lo_key"],))
        for table in ("rollup_1m", "fleet_1m", "job_1m"):
            db.execute(f"DELETE FROM {table} WHERE bucket < ?", (now - r.minute_seconds,))
        for table in ("rollup_1h", "job_1h"):
            db.execute(f"DELETE FROM {table} WHERE bucket < ?", (now - r.hour_seconds,))
        # a hold names its job for as long as its hours are kept; a job with no hold left is gone
        db.execute("DELETE FROM holds WHERE until < ?", (now - r.hour_seconds,))
        jobs_gone = db.execute("DELETE FROM jobs WHERE job_id NOT IN (SELECT job_id FROM holds)").rowcount > 0
        db.execute("DELETE FROM events WHERE ts < ?", (now - r.hour_seconds,))
        cut = _fit_budget(db, r.budget_bytes)
    freed = db.execute("PRAGMA freelist_count").fetchone()[0]
    # Every free page back to the file (a no-op on a store made before auto_vacuum was set):
    # executescript steps the pragma to its end, where execute frees one page a call.
    db.executescript("PRAGMA incremental_vacuum;")
    # The file shrinks when the WAL is written back. SQLite's own checkpoint does that every
    # 1,000 pages of WAL; one here each minute cost a third of the agent's write time at 8 GPUs
    # (an fsync), so only the budget's cuts and large frees take it now.
    if cut or freed >= _CHECKPOINT_FREED_PAGES:
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    return jobs_gone


def used_bytes(db: sqlite3.Connection) -> int:
    """Bytes the store's pages hold (the file less its free pages; the WAL beside it not counted)."""
    pages, free, size = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size"))
    return (pages - free) * size


def _fit_budget(db: sqlite3.Connection, budget_bytes: int) -> bool:
    """Cut the oldest of each table in turn until the file is within the budget; True if it cut."""
    cut_any = False
    for table, ends, floor_seconds, alongside in _BUDGET_FLOORS:
        while used_bytes(db) > budget_bytes:
            low, high = db.execute(ends).fetchone()
            if low is None or high - low <= floor_seconds + 60:
                break
            cut = low + (high - low - floor_seconds) / 2  # halve what is over the floor, and look again
            if table == "samples":
                db.execute("DELETE FROM samples WHERE key < ?", (span(cut, OPEN)["lo_key"],))
            for name in alongside:  # rollups: the table itself is among them
                db.execute(f"DELETE FROM {name} WHERE bucket < ?", (cut,))
            cut_any = True
    return cut_any
