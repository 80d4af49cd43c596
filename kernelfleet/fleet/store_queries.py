"""The store's reads: each a function of one read-only connection inside one read transaction
(one snapshot), which writes nothing. The minute still open (after ``rolled_until``) is summed from
the raw rows as it is read, so a rollup read mid-minute shows what has arrived and is never frozen
there; every range longer than that reads rollups."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable

from kernelfleet.errors import UsageError
from kernelfleet.fleet import store_schema
from kernelfleet.fleet.store_schema import (
    BOTTLENECKS,
    IN_SPAN,
    JOB_SUMS,
    METRICS,
    OPEN,
    RESOLUTIONS,
    floor,
    span,
)

_MINUTES = store_schema.minutes()  # every GPU's minutes in a span
_JOB_MINUTES = store_schema.job_minutes()
_OF_UUID = "SELECT gpu_id FROM gpus WHERE uuid = :uuid"


def gpus(db: sqlite3.Connection) -> list[dict[str, object]]:
    cur = db.execute("SELECT host, uuid, mig_instance, gpu_index, name, sku FROM gpus ORDER BY host, gpu_index, mig_instance")
    return [
        {"host": h, "uuid": u, "mig_instance": None if mig < 0 else mig, "gpu_index": i, "name": n, "sku": s}
        for h, u, mig, i, n, s in cur
    ]


def series(db: sqlite3.Connection, uuid: str, start: float, end: float, resolution: str = "raw",
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


def fleet_series(db: sqlite3.Connection, start: float, end: float) -> list[dict[str, float | None]]:
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


def jobs(db: sqlite3.Connection, limit: int | None = None) -> list[str]:
    return [row[0] for row in db.execute("SELECT name FROM jobs ORDER BY name LIMIT ?", (_limit(limit),))]


def job_summaries(db: sqlite3.Connection, since: float, limit: int | None = None) -> list[dict[str, object]]:
    """Every job seen since the minute of ``since``: its GPUs and share-weighted OFU, least
    efficient first (from the job minute rollups, and the open minute's raw rows)."""
    rolled = _rolled_until(db)
    columns = "job_id, gpu_id, share_ofu_sum, share_ofu_seconds"
    rows = db.execute(
        "SELECT j.name, j.kind, COUNT(DISTINCT x.gpu_id), SUM(x.share_ofu_sum) / NULLIF(SUM(x.share_ofu_seconds), 0) "
        f"AS ofu FROM (SELECT {columns} FROM job_1m WHERE bucket >= :from AND bucket < :rolled UNION ALL "
        f"SELECT {columns} FROM ({_JOB_MINUTES})) x JOIN jobs j USING (job_id) "
        "GROUP BY x.job_id ORDER BY ofu IS NULL, ofu LIMIT :limit",
        {**span(rolled, OPEN), "from": floor(since, 60), "rolled": rolled, "limit": _limit(limit)})
    return [{"job": j, "kind": k, "gpus": n, "ofu_ratio": o} for j, k, n, o in rows]


def job_report(db: sqlite3.Connection, job: str) -> dict[str, object] | None:
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
    # Every GPU's sums over the job's life, in one pass (its bottleneck classes come from the same rows)
    classes = [f"b{i}_seconds" for i in range(len(BOTTLENECKS))]
    rolled = _rolled_until(db)
    open_rows = db.execute(f"SELECT * FROM ({_JOB_OPEN})", {**span(rolled, OPEN), "job_id": job_id}).fetchall()
    life = _job_sums(db, job_id, open_rows, "1h", "gpu_id", ("windows", "seconds", "share_sum", "ofu_sum", "ofu_seconds",
                                                  "approximate", *classes), float("-inf"))
    names = {g: rest for g, *rest in db.execute(
        f"SELECT gpu_id, host, uuid, mig_instance, gpu_index, name FROM gpus WHERE gpu_id IN ({', '.join(map(str, life))})")}
    per_gpu = sorted((
        {"host": h, "uuid": u, "mig_instance": None if mig < 0 else mig, "gpu_index": i, "name": n,
         "ofu_ratio": ofu_sum / ofu_seconds if ofu_seconds else None, "seconds": seconds,
         "mean_share": share_sum / windows, "approximate": bool(approx)}
        for gpu, (windows, seconds, share_sum, ofu_sum, ofu_seconds, approx, *_) in life.items()
        for h, u, mig, i, n in (names[gpu],)), key=lambda g: (g["host"], g["gpu_index"]))
    totals = [sum(sums[6 + i] for sums in life.values()) for i in range(len(BOTTLENECKS))]
    by_class = sorted(((name, s) for name, s in zip(BOTTLENECKS, totals) if s), key=lambda c: -c[1])

    def timeline(resolution: str, since: float) -> list[dict[str, float | None]]:
        points = _job_sums(db, job_id, open_rows, resolution, "bucket", ("share_ofu_sum", "share_ofu_seconds"), since)
        return [{"ts": ts, "ofu_ratio": ofu / seconds} for ts, (ofu, seconds) in sorted(points.items()) if seconds > 0]

    return {"job": job, "kind": kind, "user": user, "first_seen": first, "last_seen": last,
            "gpus": per_gpu, "bottleneck_seconds": dict(by_class),
            # what a chart of the job draws: its last day in minutes, its life in hours
            "timeline_1m": timeline("1m", floor(last, 60) - 86400 + 60),
            "timeline_1h": timeline("1h", float("-inf")),
            "events": events(db, job=job)}


_JOB_OPEN = store_schema.job_minutes("AND h.job_id = :job_id")  # a job's open minutes, from raw rows
_JOB_COLUMNS = ("job_id", "bucket", "gpu_id", *JOB_SUMS)


def _job_sums(db: sqlite3.Connection, job_id: int, open_rows: list[tuple], resolution: str, by: str,
              columns: tuple[str, ...], since: float) -> dict[int, list[float]]:
    """A job's ``columns`` summed per ``by`` (``bucket`` of the resolution, or ``gpu_id``) from the
    bucket ``since`` on, as this snapshot sees them (``approximate``: its largest).

    Each part is summed in SQL on its own and the parts added here: the closed buckets of the
    resolution, for hours the rolled minutes of the open one, and the open minutes (``open_rows``:
    the job's rows of job_1m's shape summed from raw rows, read once for the whole report). A
    part reads its table in its key's order (job, bucket, GPU), so summing it per bucket takes no
    sort; grouping the UNION ALL of the parts sorted every row of them (a 30-day job report's
    cost was that sort)."""
    rolled = _rolled_until(db)
    hour_rolled = floor(rolled, 3600) if math.isfinite(rolled) else rolled
    seconds = RESOLUTIONS[resolution]
    finer = f"CAST(bucket / {seconds} AS INTEGER) * {seconds}" if by == "bucket" else by
    sums = ", ".join(f"MAX({c})" if c == "approximate" else f"SUM({c})" for c in columns)
    closed = ":hour_rolled" if resolution == "1h" else ":rolled"
    parts = [(f"SELECT {by}, {sums} FROM job_{resolution} WHERE job_id = :job_id AND bucket >= :from AND "
              f"bucket < {closed} GROUP BY {by}")]
    if resolution == "1h":
        parts.append(f"SELECT {finer}, {sums} FROM job_1m WHERE job_id = :job_id AND bucket >= :hour_rolled AND "
                     f"bucket < :rolled GROUP BY 1")
    params = {"job_id": job_id, "from": since, "rolled": rolled, "hour_rolled": hour_rolled}
    at = [_JOB_COLUMNS.index(c) for c in columns]
    opened = [(floor(row[1], seconds) if by == "bucket" else row[2], *(row[i] for i in at))
              for row in open_rows if row[1] >= since]
    largest = {columns.index("approximate")} if "approximate" in columns else set()
    added: dict[int, list[float]] = {}
    for rows in [*(db.execute(sql, params) for sql in parts), opened]:
        for key, *values in rows:
            have = added.get(key)
            if have is None:
                added[key] = values
                continue
            for i, v in enumerate(values):
                have[i] = max(have[i], v) if i in largest else have[i] + v
    return added


def events(db: sqlite3.Connection, since: float = 0.0, job: str | None = None,
           limit: int | None = None) -> list[dict[str, object]]:
    """Events since ``since`` (of ``job``), oldest first; with ``limit``, the newest that many."""
    query = ("SELECT e.ts, e.kind, g.uuid, e.job, e.detail FROM events e LEFT JOIN gpus g USING (gpu_id) "
             "WHERE e.ts >= ?" + (" AND e.job = ?" if job is not None else "") + " ORDER BY e.ts DESC LIMIT ?")
    params = (since, job) if job is not None else (since,)
    rows = db.execute(query, (*params, _limit(limit))).fetchall()
    return [{"ts": ts, "kind": k, "uuid": u, "job": j, "detail": d} for ts, k, u, j, d in reversed(rows)]


def ofu_grid(db: sqlite3.Connection, start: float, end: float,
             step_seconds: int) -> list[tuple[str, str, int, int | None, int, float | None]]:
    """Every GPU's time-weighted OFU per step in [start, end] (a dashboard heatmap): rows of
    (host, uuid, gpu_index, mig_instance, step start, OFU); a step of whole hours reads the
    hour rollups, any other the minute rollups (and the open minute from raw rows)."""
    resolution = "1h" if step_seconds % 3600 == 0 else "1m"
    sql, params = _rolled(db, resolution, "rollup", "gpu_id, bucket, ofu_sum, ofu_seconds", "1",
                          _MINUTES, floor(start, step_seconds), end)
    rows = db.execute(
        f"SELECT g.host, g.uuid, g.gpu_index, g.mig_instance, CAST(x.bucket / {step_seconds} AS INTEGER) * "
        f"{step_seconds} AS b, SUM(x.ofu_sum) / NULLIF(SUM(x.ofu_seconds), 0) FROM ({sql}) x JOIN gpus g "
        "USING (gpu_id) GROUP BY x.gpu_id, b ORDER BY g.host, g.gpu_index, g.mig_instance, b", params)
    return [(h, u, i, None if mig < 0 else mig, b, ofu) for h, u, i, mig, b, ofu in rows]


def job_seconds_below(db: sqlite3.Connection, job: str, ofu_ratio: float) -> dict[tuple[str, int | None], float]:
    """Per (uuid, mig_instance) the job held: its share of the seconds of the minutes whose OFU was
    below ``ofu_ratio`` (a minute without an OFU is not below). Minute rollups: the last 30 days."""
    found = db.execute("SELECT job_id FROM jobs WHERE name = ?", (job,)).fetchone()
    if found is None:
        return {}
    sql, params = _rolled(db, "1m", "job", "gpu_id, bucket, windows, seconds, share_sum, ofu_sum, ofu_seconds",
                          "job_id = :job_id", _JOB_OPEN, float("-inf"), OPEN)
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
    hour_rolled = floor(rolled, 3600) if math.isfinite(rolled) else rolled
    minutes_from = ":hour_rolled" if resolution == "1h" else ":from"
    parts = [(f"SELECT {columns} FROM {prefix}_1h WHERE {where} AND bucket >= :from AND bucket <= :to "
             "AND bucket < :hour_rolled")] if resolution == "1h" else []
    parts += [(f"SELECT {columns} FROM {prefix}_1m WHERE {where} AND bucket >= {minutes_from} AND bucket <= :to "
              "AND bucket < :rolled"), f"SELECT {columns} FROM ({open_minutes})"]
    return " UNION ALL ".join(parts), {**span(rolled, OPEN), "from": since, "to": to, "rolled": rolled,
                                       "hour_rolled": hour_rolled}


def _limit(limit: int | None) -> int:
    """SQLite's LIMIT for ``limit`` rows (-1: every row)."""
    return -1 if limit is None else limit


def _rolled_until(db: sqlite3.Connection) -> float:
    """Where the rolled minutes end, as this snapshot sees it (before the first roll: nothing rolled)."""
    row = db.execute("SELECT value FROM meta WHERE key='rolled_until'").fetchone()
    return float(row[0]) if row else float("-inf")
