"""The minute summed in memory as its windows arrive (store_minute.py) writes the rollups the SQL
roll from raw rows wrote on the same windows: through jobs that change mid-minute, shared GPUs,
missing values, stale and shorter windows, a window written again, a GPU that appears, and a
writer abandoned mid-minute (as after kill -9) whose successor goes on."""

import dataclasses
import shutil
import sqlite3

import pytest

from kernelfleet.fleet import store_roll
from kernelfleet.fleet.store import GpuRow, JobRow, Store
from kernelfleet.fleet.store_schema import BOTTLENECKS

pytestmark = pytest.mark.unit
T0 = 1_800_000_000.0 - 150 + 17  # mid-minute, two and a half minutes before an hour ends
TABLES = {"rollup_1m": 2, "job_1m": 3, "fleet_1m": 1, "rollup_1h": 2, "job_1h": 3}  # table: key columns


def window(g: int, i: int, ofu: float | None = None) -> GpuRow:
    ofu = (0.3 + 0.1 * g + 0.003 * (i % 17)) if ofu is None else ofu
    return GpuRow(host="n", uuid=f"GPU-{g}", mig_instance=None, gpu_index=g, name="NVIDIA H200", sku="h200-sxm",
                  ts=T0 + i + 0.25 * g, window_seconds=0.5 if g == 2 and i % 5 == 0 else 1.0,
                  bottleneck=BOTTLENECKS[(i // 9 + g) % len(BOTTLENECKS)], stale=g == 0 and i % 11 == 0,
                  ofu=None if g == 1 and i % 7 == 0 else ofu, tensor_active=0.7, sm_clock_hertz=1.4e9,
                  sm_active=0.9, sm_occupancy=None if i % 13 == 0 else 0.2, dram_bandwidth=0.3,
                  power_watts=600.0 + g + i % 3)


def jobs_of(g: int, i: int) -> list[JobRow]:
    def hold(job: str, share: float = 1.0) -> JobRow:
        return JobRow(job, "slurm", "ana", "n", f"GPU-{g}", None, T0 + i, share, share < 1)

    if g == 0:
        return [hold("a")]
    if g == 1:
        return [hold("a" if i < 100 else "b")]  # b takes it mid-minute
    if g == 2:
        return [hold("a", 0.75), hold("b", 0.25)]  # time-shared all along
    return [hold("c")] if i >= 73 else []  # GPU 3 idle, then c from the first window of a minute


def batch(i: int) -> tuple[list[GpuRow], list[JobRow]]:
    gpus = range(5) if i >= 250 else range(4)  # GPU 4 appears mid-minute
    return [window(g, i) for g in gpus], [j for g in gpus for j in jobs_of(g, i)]


def rollups(db: sqlite3.Connection) -> dict[str, dict[tuple, tuple]]:
    out = {}
    for table, keys in TABLES.items():
        out[table] = {row[:keys]: row[keys:] for row in db.execute(f"SELECT * FROM {table}")}
    return out


def test_minutes_summed_in_memory_equal_the_roll_from_raw_rows_across_a_restart_mid_minute(tmp_path):
    path = tmp_path / "kf.db"
    store = Store(path)
    from_memory, from_raw = [], []

    def trace(sql: str) -> None:
        if sql.startswith("INSERT OR REPLACE INTO rollup_1m"):
            (from_memory if " VALUES " in sql else from_raw).append(sql)

    store.db.set_trace_callback(trace)
    for i in range(400):
        if i == 150:  # abandoned mid-minute, as after kill -9: no close(), the open minute's sums gone
            store.db.close()
            store = Store(path)
            store.db.set_trace_callback(trace)
        store.write(*batch(i))
        if i == 200:  # a window of the open minute written again, with another value
            store.write([window(0, 199, ofu=0.9)], jobs_of(0, 199))
    rolled_until = store._writer.rolled_until
    store.db.close()
    assert from_memory and from_raw  # both paths ran
    shutil.copy(path, tmp_path / "reference.db")
    reference = sqlite3.connect(tmp_path / "reference.db", isolation_level=None)
    reference.execute("BEGIN")
    store_roll.roll(reference, int(T0 // 60) * 60, rolled_until)  # every minute again, from raw rows
    reference.execute("COMMIT")
    got, want = rollups(sqlite3.connect(path)), rollups(reference)
    # 7 minutes of 4 GPUs and 3 of GPU 4; the closed hour of GPUs 0-3 and its jobs a, b and c
    assert {t: len(v) for t, v in want.items()} == {"rollup_1m": 31, "job_1m": 37, "fleet_1m": 7, "rollup_1h": 4,
                                                    "job_1h": 6}
    for table in TABLES:
        assert got[table].keys() == want[table].keys(), table
        for key, values in want[table].items():
            assert got[table][key] == pytest.approx(values, rel=1e-12, abs=1e-12), (table, key)


def test_a_job_that_holds_a_gpu_all_minute_is_summed_at_its_share(tmp_path):
    """Two jobs share a GPU all minute at 0.75 / 0.25: their minute rows are the GPU's at their share."""
    store = Store(tmp_path / "kf.db")
    for i in range(13, 74):  # a whole minute (from T0 + 13.5), then the first window after it
        store.write([window(2, i)], jobs_of(2, i))
    db = sqlite3.connect(tmp_path / "kf.db")
    minute = int((T0 + 13.5) // 60) * 60
    (gpu_seconds, gpu_ofu) = db.execute("SELECT seconds, ofu_sum FROM rollup_1m WHERE bucket = ?", (minute,)).fetchone()
    shares = dict(db.execute("SELECT j.name, x.share_ofu_sum / x.ofu_sum FROM job_1m x JOIN jobs j USING (job_id) "
                             "WHERE bucket = ?", (minute,)))
    assert shares == pytest.approx({"a": 0.75, "b": 0.25})
    assert gpu_seconds == 60 - 12 * 0.5  # twelve of its windows are half a second
    assert gpu_ofu == pytest.approx(sum(w.ofu * w.window_seconds for w in (window(2, i) for i in range(13, 73))))


def test_a_fleets_window_in_statements_of_many_rows_writes_what_small_batches_write(tmp_path):
    """260 GPUs a window go in statements of many rows (100, 100, then 60), and their minutes are summed
    in memory; the same windows written 20 GPUs a batch (a statement a row, and minutes rolled from
    raw rows: no batch names the GPUs of the last) give the same samples and holds, and the same
    rollups. Missing values come in 1-s windows (found when the minute is summed) and in shorter
    ones (found as they come)."""
    fleet, small = Store(tmp_path / "fleet.db"), Store(tmp_path / "small.db")
    statements = []
    fleet.db.set_trace_callback(lambda sql: statements.append(sql[:40]))
    for i in range(130):  # two minutes close
        rows = [dataclasses.replace(window(g, i), ts=T0 + i + g / 1000) for g in range(260)]  # in one minute
        jobs = [j for g in range(260) for j in jobs_of(g, i)]
        fleet.write(rows, jobs)
        for part in range(0, 260, 20):
            small.write(rows[part:part + 20], [j for j in jobs if int(j.uuid[4:]) in range(part, part + 20)])
    fleet.db.set_trace_callback(None)
    fleet.close()
    small.close()
    assert sum(s.startswith("INSERT OR REPLACE INTO samples VALUES") for s in statements) == 3 * 130  # 100, 100, 60
    # both minutes summed in memory: a row of each GPU but the few whose jobs changed within it
    assert sum(s.startswith("INSERT OR REPLACE INTO rollup_1m VALUES") for s in statements) >= 2 * 250
    got, want = sqlite3.connect(tmp_path / "fleet.db"), sqlite3.connect(tmp_path / "small.db")
    for table in ("samples", "holds", "gpus", "jobs"):
        assert got.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall() == \
            want.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall(), table
    assert got.execute("SELECT COUNT(*), SUM(ofu IS NULL), SUM(sm_occupancy IS NULL), "
                       "SUM(stale), SUM(window_seconds < 1) FROM samples").fetchone() == (260 * 130, 19, 10 * 260, 12, 26)
    got_rollups, want_rollups = rollups(got), rollups(want)
    assert len(want_rollups["rollup_1m"]) == 2 * 260  # the third minute is still open
    for table in TABLES:
        assert got_rollups[table].keys() == want_rollups[table].keys(), table
        for key, values in want_rollups[table].items():
            assert got_rollups[table][key] == pytest.approx(values, rel=1e-12, abs=1e-12), (table, key)
