"""The embedded store's schema (version 2), the SQL its rollups are made of, and the migration
from version 1.

Shaped for its queries (issue 21): a window costs one narrow row per GPU appended at the end of
``samples``, whose integer key is the window's millisecond then its GPU (no second index: a per-GPU
index put each window's rows on as many leaf pages as there are GPUs, 13-15 KB written per 235-byte
sample; and a rowid table takes a window's rows in 0.6x the time of a WITHOUT ROWID one on this VM). Which job held which GPU is
a *hold*, one row per span of windows with the same job, share and flag, not a row per window.
Every query a dashboard asks for a range reads rollups: per GPU and minute or hour, per fleet and
minute, and per job, GPU and minute or hour (``job_1m``, ``job_1h``, rolled from raw rows and holds
when a minute closes). Raw rows are read only for the minute still open and for a GPU's raw series.
"""

from __future__ import annotations

import sqlite3

from kernelfleet.ofu.bottleneck import Bottleneck

SCHEMA_VERSION = 2
# Columns kept for every window: name in the store -> name in the row given to write().
METRICS = ("ofu", "tensor_active", "sm_clock_hertz", "sm_active", "sm_occupancy", "dram_bandwidth", "power_watts")
RESOLUTIONS = {"1m": 60, "1h": 3600}
# A window's bottleneck class is kept as its index here (a byte, not the class's name).
BOTTLENECKS = tuple(b.value for b in Bottleneck)
OPEN = 2.0**62  # the end of a hold still open, and of "every raw row from rolled_until on"

_ROLLUP_COLUMNS = ", ".join(f"{m}_sum REAL NOT NULL, {m}_seconds REAL NOT NULL" for m in METRICS)
# What a job's rollup row sums over the windows of one GPU held by the job: ofu_* unweighted (the
# GPU's OFU while the job held it), share_ofu_* weighted by the job's share (the job's own OFU).
JOB_SUMS = ("windows", "seconds", "share_sum", "ofu_sum", "ofu_seconds", "share_ofu_sum", "share_ofu_seconds",
            "approximate", *(f"b{i}_seconds" for i in range(len(BOTTLENECKS))))

DDL = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS gpus (
        gpu_id INTEGER PRIMARY KEY,
        host TEXT NOT NULL, uuid TEXT NOT NULL, mig_instance INTEGER NOT NULL DEFAULT -1,
        gpu_index INTEGER NOT NULL, name TEXT NOT NULL, sku TEXT,
        UNIQUE (host, uuid, mig_instance))""",
    # key = the window's millisecond << 20 | gpu_id: a window's rows append at the end of the table,
    # and a range of time is a range of keys. REAL columns holding a whole number (window_seconds
    # 1.0) take one byte on disk; bottleneck is a byte too.
    f"""CREATE TABLE IF NOT EXISTS samples (
        key INTEGER PRIMARY KEY, gpu_id INTEGER NOT NULL, ts REAL NOT NULL, window_seconds REAL NOT NULL,
        {", ".join(f"{m} REAL" for m in METRICS)},
        bottleneck INTEGER NOT NULL, stale INTEGER NOT NULL)""",
    *(stmt for name in RESOLUTIONS for stmt in (
        f"""CREATE TABLE IF NOT EXISTS rollup_{name} (
            gpu_id INTEGER NOT NULL, bucket INTEGER NOT NULL, seconds REAL NOT NULL, stale_seconds REAL NOT NULL,
            {_ROLLUP_COLUMNS}, PRIMARY KEY (gpu_id, bucket)) WITHOUT ROWID""",
        # rolling hours from minutes and retention select by bucket across every GPU
        f"CREATE INDEX IF NOT EXISTS rollup_{name}_bucket ON rollup_{name} (bucket)",
    )),
    """CREATE TABLE IF NOT EXISTS fleet_1m (
        bucket INTEGER PRIMARY KEY, gpus INTEGER NOT NULL, ofu_sum REAL NOT NULL, ofu_seconds REAL NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS jobs (job_id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, user TEXT)",
    # A span of windows [since, until] in which a job held a GPU at one share; until is OPEN while
    # the span goes on (the writer closes it when a window of the GPU comes without it).
    """CREATE TABLE IF NOT EXISTS holds (
        job_id INTEGER NOT NULL, gpu_id INTEGER NOT NULL, since REAL NOT NULL, until REAL NOT NULL,
        share REAL NOT NULL, approximate INTEGER NOT NULL,
        PRIMARY KEY (gpu_id, since, job_id)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS holds_job ON holds (job_id)",
    *(stmt for name in RESOLUTIONS for stmt in (
        f"""CREATE TABLE IF NOT EXISTS job_{name} (
            job_id INTEGER NOT NULL, bucket INTEGER NOT NULL, gpu_id INTEGER NOT NULL,
            {", ".join(f"{c} REAL NOT NULL" for c in JOB_SUMS)},
            PRIMARY KEY (job_id, bucket, gpu_id)) WITHOUT ROWID""",
        f"CREATE INDEX IF NOT EXISTS job_{name}_bucket ON job_{name} (bucket)",
    )),
    """CREATE TABLE IF NOT EXISTS events (
        id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL, gpu_id INTEGER, job TEXT, detail TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS events_ts ON events (ts)",
]


GPU_BITS = 20  # a store of up to a million GPUs
KEY = f"(CAST(:ts * 1000 AS INTEGER) << {GPU_BITS}) | :gpu_id"  # a window's key, as SQL
# Raw rows in [:lo, :hi): the key range finds them, the times cut them exactly (see span()).
IN_SPAN = "s.key >= :lo_key AND s.key < :hi_key AND s.ts >= :lo AND s.ts < :hi"


def span(lo: float, hi: float) -> dict[str, float]:
    """The parameters of IN_SPAN: the keys of every millisecond in [lo, hi], and the times (keys end
    in the year 2223: 8e9 s, where 64 bits run out)."""
    return {"lo_key": _key(lo), "hi_key": _key(min(hi, 8e9)) + (1 << GPU_BITS), "lo": lo, "hi": hi}


def _key(ts: float) -> int:
    return int(max(ts, 0.0) * 1000) << GPU_BITS


def floor(ts: float, seconds: int) -> int:
    """The start of the bucket of ``seconds`` that holds ``ts``."""
    return int(ts // seconds) * seconds


def minutes(where: str = "") -> str:
    """One row per GPU and minute from raw windows in IN_SPAN, in rollup_1m's columns; ``where`` adds
    a condition on the raw rows (``s.``)."""
    sums = ", ".join(
        f"SUM(COALESCE(s.{m} * s.window_seconds, 0)) AS {m}_sum, "
        f"SUM(CASE WHEN s.{m} IS NULL THEN 0 ELSE s.window_seconds END) AS {m}_seconds" for m in METRICS)
    return (f"SELECT s.gpu_id AS gpu_id, CAST(s.ts / 60 AS INTEGER) * 60 AS bucket, SUM(s.window_seconds) AS seconds, "
            f"SUM(s.stale * s.window_seconds) AS stale_seconds, {sums} FROM samples s WHERE {IN_SPAN} "
            f"{where} GROUP BY 1, 2")


def job_minutes(where: str = "") -> str:
    """One row per job, minute and GPU from raw windows in IN_SPAN and the holds over them, in
    job_1m's columns; ``where`` adds a condition on the holds (``h.``)."""
    sums = (
        "COUNT(*)", "SUM(s.window_seconds)", "SUM(h.share)", "SUM(COALESCE(s.ofu * s.window_seconds, 0))",
        "SUM(CASE WHEN s.ofu IS NULL THEN 0 ELSE s.window_seconds END)",
        "SUM(COALESCE(s.ofu * h.share * s.window_seconds, 0))",
        "SUM(CASE WHEN s.ofu IS NULL THEN 0 ELSE h.share * s.window_seconds END)", "MAX(h.approximate)",
        *(f"SUM(CASE WHEN s.bottleneck = {i} THEN s.window_seconds ELSE 0 END)" for i in range(len(BOTTLENECKS))),
    )
    columns = ", ".join(f"{expr} AS {name}" for expr, name in zip(sums, JOB_SUMS, strict=True))
    return (
        f"SELECT h.job_id AS job_id, CAST(s.ts / 60 AS INTEGER) * 60 AS bucket, s.gpu_id AS gpu_id, {columns} "
        # samples first: a minute's windows, each finding its GPU's hold by the key (gpu_id, since)
        "FROM samples s CROSS JOIN holds h ON h.gpu_id = s.gpu_id AND h.since <= s.ts AND h.until >= s.ts "
        f"WHERE {IN_SPAN} {where} GROUP BY 1, 2, 3"
    )


def create(db: sqlite3.Connection) -> None:
    """The tables of a new store, or those a store lacks."""
    for statement in DDL:
        db.execute(statement)


def migrate_v1(db: sqlite3.Connection) -> None:
    """Version 1 to 2, inside the caller's transaction: samples narrowed and re-keyed without their
    per-GPU index, every job window a hold of its own (exact; later windows make spans), rollups
    kept; the job rollups are rolled by the caller from what is migrated here."""
    db.execute("DROP INDEX IF EXISTS samples_gpu")
    db.execute("DROP INDEX IF EXISTS job_windows_ts")
    db.execute("ALTER TABLE samples RENAME TO samples_v1")
    create(db)
    code = " ".join(f"WHEN '{name}' THEN {i}" for i, name in enumerate(BOTTLENECKS))
    db.execute(f"INSERT INTO samples SELECT {KEY.replace(':ts', 'ts').replace(':gpu_id', 'gpu_id')}, gpu_id, ts, "
               f"window_seconds, {', '.join(METRICS)}, "
               f"CASE bottleneck {code} ELSE {BOTTLENECKS.index(Bottleneck.UNKNOWN.value)} END, stale FROM samples_v1")
    db.execute("INSERT INTO jobs (name, kind, user) SELECT job, MAX(kind), MAX(user) FROM job_windows GROUP BY job")
    db.execute("INSERT INTO holds SELECT j.job_id, w.gpu_id, w.ts, w.ts, w.share, w.approximate "
               "FROM job_windows w JOIN jobs j ON j.name = w.job")
    db.execute("DROP TABLE samples_v1")
    db.execute("DROP TABLE job_windows")
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
