"""The store shaped for its queries (issue 21): holds instead of job rows per window, job rollups
rolled as minutes close, one transaction per window batch, a byte budget, and the migration of a
store written by schema version 1 (a file that version wrote, committed under tests/data/store)."""

import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
from recorded import at_end_of

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent, attribute_recorded
from kernelfleet.fleet.report import job_report
from kernelfleet.fleet.store import GpuRow, JobRow, Retention, Store
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
DATA = Path(__file__).parents[1] / "data"
DROP = DATA / "h200-detector" / "h200-drop.jsonl.gz"
V1 = DATA / "store" / "v1-h200-drop.db"  # the v1 store of DROP: what kernelfleet wrote before schema 2
T0 = 1_800_000_000.0  # a minute boundary


def gpu(g: int, ts: float, ofu: float = 0.5, bottleneck: str = "tensor-bound") -> GpuRow:
    return GpuRow(host="n", uuid=f"GPU-{g}", mig_instance=None, gpu_index=g, name="NVIDIA H200", sku="h200-sxm",
                  ts=ts, window_seconds=1.0, bottleneck=bottleneck, stale=False, ofu=ofu, tensor_active=0.7,
                  sm_clock_hertz=1.4e9, sm_active=0.9, sm_occupancy=0.2, dram_bandwidth=0.3, power_watts=650.0)


def held(job: str, g: int, ts: float, share: float = 1.0) -> JobRow:
    return JobRow(job, "slurm", "ana", "n", f"GPU-{g}", None, ts, share, share < 1)


def filled(path: Path) -> Store:
    store = Store(path)
    agent = Agent(ReplaySource(DROP), store, Catalog.load(), host="node-1", identify=attribute_recorded,
                  clock=at_end_of(DROP))
    agent.run(threading.Event())
    return store


def test_a_version_1_store_is_migrated_and_reads_as_a_new_one(tmp_path):
    shutil.copy(V1, tmp_path / "old.db")
    old = sqlite3.connect(tmp_path / "old.db")
    assert old.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("1",)
    assert old.execute("SELECT COUNT(*) FROM job_windows").fetchone() == (94,)
    old.close()
    migrated, fresh = Store(tmp_path / "old.db"), filled(tmp_path / "new.db")
    db = sqlite3.connect(tmp_path / "old.db")
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert "job_windows" not in tables and "samples_gpu" not in tables and {"holds", "job_1m", "job_1h"} <= tables
    (job,) = migrated.jobs()
    assert migrated.jobs() == fresh.jobs()
    rows = job_report(migrated.job_report(job))
    (g,) = rows.gpus
    assert (round(g.ofu_ratio, 3), round(g.seconds), g.mean_share) == (0.459, 94, 1.0)
    assert rows.minute_levels == [5, 2]
    assert {k: round(v, 3) for k, v in rows.bottleneck_shares.items()} == {
        "low-occupancy/launch-bound": 0.489, "tensor-bound": 0.489, "idle": 0.021}
    (uuid,) = {x["uuid"] for x in migrated.gpus()}
    for resolution in ("raw", "1m", "1h"):
        assert flat(migrated.series(uuid, 0, 4e9, resolution, ["ofu", "power_watts"])) == pytest.approx(
            flat(fresh.series(uuid, 0, 4e9, resolution, ["ofu", "power_watts"])))
    assert len(migrated.series(uuid, 0, 4e9)) == 94
    assert [e["kind"] for e in migrated.events()] == ["regression", "regression"]
    new, old_report = fresh.job_report(job), migrated.job_report(job)
    for key in ("first_seen", "last_seen", "bottleneck_seconds"):
        assert old_report[key] == pytest.approx(new[key]), key
    for key in ("timeline_1m", "timeline_1h"):
        assert flat(old_report[key]) == pytest.approx(flat(new[key])), key
    # and it goes on: a later window of the same job extends it
    later = migrated.series(uuid, 0, 4e9)[-1]["ts"] + 1
    migrated.write([_on(uuid, later)], [_held_on(job, uuid, later)])
    assert migrated.job_report(job)["last_seen"] == later


def flat(points: list[dict]) -> list[float]:
    return [v for p in points for v in p.values()]


def _on(uuid: str, ts: float) -> GpuRow:
    return GpuRow(host="node-1", uuid=uuid, mig_instance=None, gpu_index=0, name="NVIDIA H200", sku="h200-sxm", ts=ts,
                  window_seconds=1.0, bottleneck="idle", stale=False, ofu=0.0, tensor_active=0.0, sm_clock_hertz=1e9,
                  sm_active=0.0, sm_occupancy=0.0, dram_bandwidth=0.0, power_watts=100.0)


def _held_on(job: str, uuid: str, ts: float) -> JobRow:
    return JobRow(job, "recorded", None, "node-1", uuid, None, ts, 1.0, False)


def test_a_job_holding_a_gpu_for_many_windows_is_one_hold_and_its_minutes_roll_as_they_close(tmp_path):
    store = filled(tmp_path / "kf.db")
    db = sqlite3.connect(tmp_path / "kf.db")
    assert db.execute("SELECT COUNT(*), MAX(until) < 1e18 FROM holds").fetchone() == (1, 0)  # one span, still open
    store.close()  # a clean stop ends it at its last window
    assert db.execute("SELECT COUNT(*), MAX(until) < 1e18 FROM holds").fetchone() == (1, 1)
    # the minutes closed while windows came are in the job rollups; the last one was summed as read
    assert db.execute("SELECT COUNT(DISTINCT bucket) FROM job_1m").fetchone() == (1,)


def test_holds_follow_a_gpu_from_job_to_job_and_back(tmp_path):
    """a holds GPU 0 for 30 s, then b for 30 s, then a again for 30 s; GPU 1 is time-shared all along
    by a (0.75) and b (0.25): every window counts once per job that held it, at its share."""
    store = Store(tmp_path / "kf.db")
    for i in range(90):
        ts = T0 + i
        owner = "b" if 30 <= i < 60 else "a"
        ofu = {"a": 0.6, "b": 0.2}[owner]
        store.write([gpu(0, ts, ofu), gpu(1, ts, 0.4)],
                    [held(owner, 0, ts), held("a", 1, ts, 0.75), held("b", 1, ts, 0.25)])
    a, b = store.job_report("a"), store.job_report("b")
    assert {g["uuid"]: round(g["seconds"]) for g in a["gpus"]} == {"GPU-0": 60, "GPU-1": 90}
    assert {g["uuid"]: round(g["seconds"]) for g in b["gpus"]} == {"GPU-0": 30, "GPU-1": 90}
    assert {g["uuid"]: g["ofu_ratio"] for g in a["gpus"]} == pytest.approx({"GPU-0": 0.6, "GPU-1": 0.4})
    assert {g["uuid"]: (g["mean_share"], g["approximate"]) for g in b["gpus"]} == {
        "GPU-0": (1.0, False), "GPU-1": (0.25, True)}
    assert (a["first_seen"], a["last_seen"], b["first_seen"], b["last_seen"]) == (T0, T0 + 89, T0, T0 + 89)
    # the job's own OFU is share-weighted: minute 0 of a is (0.6 x 30 + 0.4 x 0.75 x 60) / (30 + 0.75 x 60)
    assert a["timeline_1m"][0]["ofu_ratio"] == pytest.approx((18 + 18) / 75)
    summaries = {s["job"]: s for s in store.job_summaries(T0)}
    assert summaries["a"]["gpus"] == summaries["b"]["gpus"] == 2
    assert summaries["b"]["ofu_ratio"] < summaries["a"]["ofu_ratio"]
    assert [s["job"] for s in store.job_summaries(T0)] == ["b", "a"]  # least efficient first
    assert store.jobs() == ["a", "b"]


def test_a_window_batch_is_one_transaction(tmp_path):
    store = Store(tmp_path / "kf.db")
    store.write([gpu(g, T0) for g in range(8)], [held("a", g, T0) for g in range(8)])
    commits = []
    store.db.set_trace_callback(lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
    for w in range(1, 121):  # two minutes: the rolls happen inside the batches that close them
        store.write([gpu(g, T0 + w) for g in range(8)], [held("a" if w < 100 else "b", g, T0 + w) for g in range(8)])
    assert len(commits) == 120


def test_holds_a_crashed_writer_left_open_end_at_its_last_window(tmp_path):
    store = Store(tmp_path / "kf.db")
    for i in range(10):
        store.write([gpu(0, T0 + i)], [held("a", 0, T0 + i)])
    store.db.close()  # killed: no close(), the hold stays open on file
    again = Store(tmp_path / "kf.db")
    again.write([gpu(0, T0 + 20)], [held("b", 0, T0 + 20)])
    assert again.job_report("a")["last_seen"] == T0 + 9 and round(again.job_report("a")["gpus"][0]["seconds"]) == 10
    assert again.job_report("b")["first_seen"] == T0 + 20


def test_the_budget_in_bytes_drops_the_oldest_raw_windows_first(tmp_path):
    store = Store(tmp_path / "kf.db")
    for w in range(3 * 3600 // 10):  # three hours of 64 GPUs, a window every 10 s
        ts = T0 + 10 * w
        store.write([gpu(g, ts) for g in range(64)], [held("a", g, ts) for g in range(64)])
    budget = int(store.used_bytes() * 0.7)
    store.retention = Retention(budget_bytes=budget)
    store.enforce_retention(now=T0 + 3 * 3600)
    assert store.used_bytes() <= budget
    assert (tmp_path / "kf.db").stat().st_size <= budget * 1.1  # the freed pages went back (auto_vacuum)
    kept = store.series("GPU-0", 0, 4e9)
    assert kept[-1]["ts"] == T0 + 3 * 3600 - 10 and kept[0]["ts"] > T0 + 3600  # the newest stay
    assert kept[0]["ts"] <= T0 + 2 * 3600  # and never less than the last hour
    assert store.series("GPU-0", 0, 4e9, "1m")[0]["ts"] == T0  # the minutes outlive the raw windows
    assert round(store.job_report("a")["gpus"][0]["seconds"]) == 3 * 3600 // 10


def test_rollup_buckets_and_holds_are_indexed_for_what_selects_them(tmp_path):
    Store(tmp_path / "kf.db").close()
    db = sqlite3.connect(tmp_path / "kf.db")

    def plan(sql: str) -> str:
        return " ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", (0,)))

    for table in ("rollup_1m", "rollup_1h", "job_1m", "job_1h"):
        assert f"INDEX {table}_bucket" in plan(f"DELETE FROM {table} WHERE bucket < ?")
    assert "INDEX holds_job" in plan("SELECT MIN(since) FROM holds WHERE job_id = ?")
    assert db.execute("PRAGMA auto_vacuum").fetchone() == (2,)  # incremental: retention gives pages back
