"""The store's roll-up: minute buckets recomputed from raw rows and holds (set-based SQL, not one
upsert per row), hours from their minutes when an hour closes."""

from __future__ import annotations

import sqlite3

from kernelfleet.fleet import store_schema
from kernelfleet.fleet.store_schema import JOB_SUMS, METRICS, floor, span

_MINUTES = store_schema.minutes()
_JOB_MINUTES = store_schema.job_minutes()
_JOB_ROLLUP_SUMS = ", ".join(f"MAX({c})" if c == "approximate" else f"SUM({c})" for c in JOB_SUMS)


def roll(db: sqlite3.Connection, start: int, end: int) -> None:
    """Recompute the minute buckets in [start, end) from raw rows and holds, and the hours that
    closed with them; record that minutes are rolled until ``end``.

    Buckets are recomputed, not added to, so rolling a bucket twice (after a crash) gives the
    same rollup. An hour is rolled once, when it closes: until then its rolled minutes stand in
    for it (rolling it every minute cost more than the minute itself).
    """
    params = span(start, end)
    db.execute(f"INSERT OR REPLACE INTO rollup_1m {_MINUTES}", params)
    # The fleet line of the dashboard reads one row a minute, not one per GPU a minute.
    db.execute(
        "INSERT OR REPLACE INTO fleet_1m SELECT bucket, COUNT(*), SUM(ofu_sum), SUM(ofu_seconds) FROM rollup_1m "
        "WHERE bucket >= ? AND bucket < ? GROUP BY bucket", (start, end),
    )
    db.execute(f"INSERT OR REPLACE INTO job_1m {_JOB_MINUTES}", params)
    if floor(end, 3600) > floor(start, 3600):
        roll_hours(db, floor(start, 3600), floor(end, 3600))
    db.execute("INSERT OR REPLACE INTO meta VALUES ('rolled_until', ?)", (str(end),))


def roll_hours(db: sqlite3.Connection, start: int, end: int, gpus: bool = True) -> None:
    """The hour buckets in [start, end) from their minutes: of every GPU (``gpus``) and job."""
    hour = "CAST(bucket / 3600 AS INTEGER) * 3600"
    if gpus:
        sums = ", ".join(f"SUM({m}_sum), SUM({m}_seconds)" for m in METRICS)
        db.execute(f"INSERT OR REPLACE INTO rollup_1h SELECT gpu_id, {hour}, SUM(seconds), SUM(stale_seconds), "
                   f"{sums} FROM rollup_1m WHERE bucket >= ? AND bucket < ? GROUP BY 1, 2", (start, end))
    db.execute(f"INSERT OR REPLACE INTO job_1h SELECT job_id, {hour}, gpu_id, {_JOB_ROLLUP_SUMS} FROM job_1m "
               "WHERE bucket >= ? AND bucket < ? GROUP BY 1, 2, 3", (start, end))


def migrated_rollups(db: sqlite3.Connection, rolled: int) -> None:
    """The job rollups version 1 had not; its hour of the open hour (v1 rolled hours every minute)
    gives way to that hour's minutes, as in version 2."""
    hour = floor(rolled, 3600)
    db.execute("DELETE FROM rollup_1h WHERE bucket >= ?", (hour,))
    first = db.execute("SELECT ts FROM samples ORDER BY key LIMIT 1").fetchone()
    if first is not None:
        db.execute(f"INSERT OR REPLACE INTO job_1m {_JOB_MINUTES}", span(floor(first[0], 60), rolled))
        roll_hours(db, floor(first[0], 3600), hour, gpus=False)
