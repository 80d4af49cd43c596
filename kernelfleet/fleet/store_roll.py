"""The store's roll-up: minute buckets written from the sums kept while they were open
(store_minute.py) or recomputed from raw rows and holds (set-based SQL, not one upsert per row),
hours from their minutes when an hour closes."""

from __future__ import annotations

import sqlite3

from kernelfleet.fleet import store_schema
from kernelfleet.fleet.store_minute import OpenMinute
from kernelfleet.fleet.store_schema import JOB_SUMS, METRICS, floor, span

_MINUTES = store_schema.minutes()
_JOB_MINUTES = store_schema.job_minutes()
_INSERT_GPU_MINUTE = f"INSERT OR REPLACE INTO rollup_1m VALUES ({', '.join('?' * (4 + 2 * len(METRICS)))})"
_INSERT_JOB_MINUTE = f"INSERT OR REPLACE INTO job_1m VALUES ({', '.join('?' * (3 + len(JOB_SUMS)))})"
_JOB_ROLLUP_SUMS = ", ".join(f"MAX({c})" if c == "approximate" else f"SUM({c})" for c in JOB_SUMS)


def roll(db: sqlite3.Connection, start: int, end: int, minute: OpenMinute | None = None) -> None:
    """Write the minute buckets in [start, end) and the hours that closed with them; record that
    minutes are rolled until ``end``. ``minute``, the sums of one of those minutes kept as its
    windows came (store_minute.py), gives the rows of its clean GPUs; every other bucket and GPU is
    recomputed from raw rows and holds.

    Buckets are recomputed, not added to, so rolling a bucket twice (after a crash) gives the
    same rollup. An hour is rolled once, when it closes: until then its rolled minutes stand in
    for it (rolling it every minute cost more than the minute itself).
    """
    if minute is None or not start <= minute.bucket < end or minute.whole_dirty:
        _from_raw(db, start, end)
    else:
        _from_raw(db, start, minute.bucket)
        db.executemany(_INSERT_GPU_MINUTE, minute.gpu_rows())
        db.executemany(_INSERT_JOB_MINUTE, minute.job_rows())
        if minute.dirty:
            _from_raw(db, minute.bucket, minute.bucket + 60, sorted(minute.dirty))
        _fleet(db, minute.bucket, minute.bucket + 60)
        _from_raw(db, minute.bucket + 60, end)
    if floor(end, 3600) > floor(start, 3600):
        roll_hours(db, floor(start, 3600), floor(end, 3600))
    db.execute("INSERT OR REPLACE INTO meta VALUES ('rolled_until', ?)", (str(end),))


def _from_raw(db: sqlite3.Connection, start: int, end: int, gpus: list[int] | None = None) -> None:
    """The minutes in [start, end) from raw rows and holds: of every GPU, or of ``gpus`` only (and
    then the fleet line is the caller's to write)."""
    if start >= end:
        return
    params = span(start, end)
    if gpus is None:
        db.execute(f"INSERT OR REPLACE INTO rollup_1m {_MINUTES}", params)
        _fleet(db, start, end)
        db.execute(f"INSERT OR REPLACE INTO job_1m {_JOB_MINUTES}", params)
        return
    among = ", ".join(str(int(g)) for g in gpus)
    db.execute(f"INSERT OR REPLACE INTO rollup_1m {store_schema.minutes(f'AND s.gpu_id IN ({among})')}", params)
    db.execute(f"INSERT OR REPLACE INTO job_1m {store_schema.job_minutes(f'AND h.gpu_id IN ({among})')}", params)


def _fleet(db: sqlite3.Connection, start: int, end: int) -> None:
    """The fleet line of the dashboard reads one row a minute, not one per GPU a minute."""
    db.execute("INSERT OR REPLACE INTO fleet_1m SELECT bucket, COUNT(*), SUM(ofu_sum), SUM(ofu_seconds) FROM rollup_1m "
               "WHERE bucket >= ? AND bucket < ? GROUP BY bucket", (start, end))


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
