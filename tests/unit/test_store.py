"""The embedded store on real SQLite files, fed with a replayed H200 recording."""

import dataclasses
import sqlite3
import threading

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.store import Retention, Store
from kernelfleet.ofu.aggregate import summarize
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
CATALOG = Catalog.load()


def fill(tmp_path, h200_trace, name="h200-bf16-gemm", **store_kw):
    store = Store(tmp_path / "kf.db", **store_kw)
    source = ReplaySource(h200_trace / f"{name}.jsonl.gz")
    agent = Agent(source, store, CATALOG, host="node-1", retention_every_seconds=1e12)
    agent.run(stop=threading.Event())
    return store, [b[0] for b in source.batches()]


def test_wal_mode_and_schema_version(tmp_path, h200_trace):
    store, _ = fill(tmp_path, h200_trace)
    db = sqlite3.connect(tmp_path / "kf.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "1"
    assert store.gpus() == [{"host": "node-1", "uuid": "GPU-ba2fb2e1-e13f-855e-a2da-7a7eab16b60f", "mig_instance": None,
                             "gpu_index": 0, "name": "NVIDIA H200", "sku": "h200-sxm"}]


def test_raw_series_and_rollups_agree_with_the_ofu_maths(tmp_path, h200_trace):
    store, samples = fill(tmp_path, h200_trace)
    uuid = samples[0].uuid
    raw = store.series(uuid, 0, 2e9, "raw", ["ofu", "sm_clock_hertz"])
    assert len(raw) == len(samples) == 24
    assert raw[3]["ofu"] == pytest.approx(0.66822, abs=1e-5)  # 0.93629 busy x 1446 MHz / 2027 MHz (f_ref, HMMA)
    # each rollup bucket's OFU is the time-weighted OFU of the windows that ended in it
    for resolution, seconds in (("1m", 60), ("1h", 3600)):
        buckets = {}
        for s in samples:
            buckets.setdefault(int(s.timestamp_seconds // seconds) * seconds, []).append(s)
        rows = store.series(uuid, 0, 2e9, resolution, ["ofu"])
        assert [r["ts"] for r in rows] == sorted(buckets)
        for row in rows:
            expected = summarize(buckets[row["ts"]], CATALOG.get("h200-sxm")).ofu_ratio
            assert row["ofu"] == pytest.approx(expected, rel=1e-9)


def test_rewriting_a_window_is_idempotent_for_raw_rows(tmp_path, h200_trace):
    store, samples = fill(tmp_path, h200_trace)
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1")
    agent.step([samples[3]])
    assert len(store.series(samples[3].uuid, 0, 2e9)) == 24


def test_retention_drops_old_raw_rows_but_keeps_rollups(tmp_path, h200_trace):
    store, samples = fill(tmp_path, h200_trace, retention=Retention(raw_seconds=10))
    store.enforce_retention(now=samples[-1].timestamp_seconds)
    kept = store.series(samples[0].uuid, 0, 2e9)
    assert 9 <= len(kept) <= 11
    assert store.series(samples[0].uuid, 0, 2e9, "1h")


def test_unknown_metric_and_resolution(tmp_path, h200_trace):
    store, samples = fill(tmp_path, h200_trace)
    with pytest.raises(UsageError, match="unknown metric"):
        store.series(samples[0].uuid, 0, 1, metrics=["nope"])
    with pytest.raises(UsageError, match="resolution"):
        store.series(samples[0].uuid, 0, 1, resolution="5m")


def test_not_a_store(tmp_path):
    (tmp_path / "x.db").write_text("this is not sqlite" * 100)
    with pytest.raises(UsageError, match="not a kernelfleet store"):
        Store(tmp_path / "x.db")


def test_store_from_a_newer_kernelfleet_is_refused(tmp_path):
    Store(tmp_path / "kf.db").close()
    db = sqlite3.connect(tmp_path / "kf.db")
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    with pytest.raises(UsageError, match="newer kernelfleet"):
        Store(tmp_path / "kf.db")


def test_a_reader_thread_never_lands_inside_the_writers_transaction(tmp_path, h200_trace):
    """The agent writes from its loop while the server reads (and rolls up) from another thread."""
    store = Store(tmp_path / "kf.db")
    samples = [b[0] for b in ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz").batches()]
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1")
    errors = []

    def read() -> None:
        try:
            for _ in range(300):
                store.series(samples[0].uuid, 0, 2e9, "1m")
                store.fleet_series(0, 2e9)
                store.job_summaries(0)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for lap in range(20):
        for s in samples:
            agent.step([dataclasses.replace(s, timestamp_seconds=s.timestamp_seconds + 60 * lap)])
    reader.join()
    assert errors == []


def test_retention_follows_the_datas_clock_so_an_old_recording_keeps_its_windows(tmp_path, h200_trace):
    month_ago = -30 * 86400.0
    samples = [dataclasses.replace(b[0], timestamp_seconds=b[0].timestamp_seconds + month_ago)
               for b in ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz").batches()]
    store = Store(tmp_path / "kf.db")
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1")
    for sample in samples:
        agent.step([sample])  # default retention: every 60 s of data, 24 h of raw windows
    assert len(store.series(samples[0].uuid, 0, 4e9)) == 24
