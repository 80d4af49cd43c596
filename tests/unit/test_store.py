"""The embedded store on real SQLite files, fed with a replayed H200 recording."""

import dataclasses
import sqlite3
import threading

import pytest
from recorded import at_end_of

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.store import GpuRow, Retention, Store
from kernelfleet.ofu.aggregate import summarize
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
CATALOG = Catalog.load()


def CLOCK(h200_trace):
    return at_end_of(h200_trace / "h200-bf16-gemm.jsonl.gz")


def fill(tmp_path, h200_trace, name="h200-bf16-gemm", **store_kw):
    store = Store(tmp_path / "kf.db", **store_kw)
    source = ReplaySource(h200_trace / f"{name}.jsonl.gz")
    agent = Agent(source, store, CATALOG, host="node-1", retention_every_seconds=1e12, clock=at_end_of(source.path))
    agent.run(stop=threading.Event())
    return store, [b[0] for b in source.batches()]


def test_wal_mode_and_schema_version(tmp_path, h200_trace):
    store, _ = fill(tmp_path, h200_trace)
    db = sqlite3.connect(tmp_path / "kf.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "2"
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


def test_a_minute_the_first_writer_left_open_is_rolled_by_the_next(tmp_path):
    # The first agent on a store is killed before its first minute closes; the next one starts two
    # minutes later. That minute used to stay without a rollup: gone from every 1-min and 1-h series.
    def row(ts: float) -> GpuRow:
        return GpuRow(host="node-1", uuid="GPU-0", mig_instance=None, gpu_index=0, name="NVIDIA H200", sku="h200-sxm",
                      ts=ts, window_seconds=1.0, bottleneck="tensor-bound", stale=False, ofu=0.5, tensor_active=0.7,
                      sm_clock_hertz=1.4e9, sm_active=0.9, sm_occupancy=0.2, dram_bandwidth=0.3, power_watts=650.0)

    minute = 1.8e9  # a whole minute
    killed = Store(tmp_path / "kf.db")
    killed.write([row(minute + 10)])
    killed.write([row(minute + 11)])  # never closed: as after kill -9
    second = Store(tmp_path / "kf.db")
    second.write([row(minute + 130)])
    second.write([row(minute + 190)])
    points = second.series("GPU-0", 0, 2e9, "1m", ["ofu"])
    assert [p["ts"] for p in points] == [minute, minute + 120, minute + 180]
    rolled = second.db.execute("SELECT seconds FROM rollup_1m WHERE bucket = ?", (minute,)).fetchone()
    assert rolled == (2.0,)  # its two windows, from the rollup, not from raw rows


def test_rewriting_a_window_is_idempotent_for_raw_rows(tmp_path, h200_trace):
    store, samples = fill(tmp_path, h200_trace)
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1", clock=CLOCK(h200_trace))
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
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1", clock=CLOCK(h200_trace))
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


def test_one_bad_clock_cannot_wipe_history_and_old_windows_are_refused(tmp_path, h200_trace, caplog):
    """Retention runs on the agent's clock. A window dated 401 days ahead once deleted every sample,
    rollup and event (retention ran on the data's clock); now it is refused and counted, and so is
    a window from a month ago (older than the store keeps raw windows)."""
    store, samples = fill(tmp_path, h200_trace)
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1",
                  clock=CLOCK(h200_trace), retention_every_seconds=0.0)
    ahead = dataclasses.replace(samples[-1], timestamp_seconds=samples[-1].timestamp_seconds + 401 * 86400)
    month_ago = dataclasses.replace(samples[0], timestamp_seconds=samples[0].timestamp_seconds - 30 * 86400)
    with caplog.at_level("WARNING"):
        assert agent.step([ahead]) == [] and agent.step([month_ago]) == []
    assert agent.rejected == {"future": 1, "past": 1}
    assert "counted, not stored" in caplog.text
    assert len(store.series(samples[0].uuid, 0, 4e10)) == 24  # retention ran, on the agent's clock
    assert store.series(samples[0].uuid, 0, 4e10, "1h")
    assert agent.latest() == []  # nor shown: a refused window is no reading


def test_a_minute_read_while_it_is_still_open_is_never_frozen_there(tmp_path, h200_trace):
    """The first half of a minute's windows, a read of the minute rollup, then the second half:
    the next read has all of them (a read that rolled the open minute up used to freeze it)."""
    samples = [b[0] for b in ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz").batches()]
    minute = 60 * (int(samples[0].timestamp_seconds) // 60 + 1)
    one_minute = [dataclasses.replace(s, timestamp_seconds=minute + 1.0 + i) for i, s in enumerate(samples)]
    store = Store(tmp_path / "kf.db")
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1", clock=CLOCK(h200_trace))
    sku, uuid = CATALOG.get("h200-sxm"), samples[0].uuid
    for s in one_minute[:12]:
        agent.step([s])
    (half,) = store.series(uuid, 0, 2e9, "1m")
    assert half["ofu"] == pytest.approx(summarize(one_minute[:12], sku).ofu_ratio, rel=1e-9)
    for s in one_minute[12:]:
        agent.step([s])
    for resolution in ("1m", "1h"):
        (whole,) = store.series(uuid, 0, 2e9, resolution)
        assert whole["ofu"] == pytest.approx(summarize(one_minute, sku).ofu_ratio, rel=1e-9)
    assert summarize(one_minute[:12], sku).ofu_ratio != pytest.approx(summarize(one_minute, sku).ofu_ratio)
    (fleet,) = store.fleet_series(0, 2e9)
    assert fleet["gpus"] == 1 and fleet["ofu"] == pytest.approx(whole["ofu"], rel=1e-9)


def test_readers_never_wait_for_the_writer_and_never_hold_it_up(tmp_path, h200_trace):
    """Each reading thread has its own read-only connection: a read goes on while the writer is
    inside a call, and a write commits while a read holds its snapshot open (WAL)."""
    store, samples = fill(tmp_path, h200_trace)
    uuid = samples[0].uuid
    read: dict[str, object] = {}

    def reader() -> None:
        read["series"] = len(store.series(uuid, 0, 2e9, "1m"))
        read["gpus"] = store.gpus()

    with store._lock:  # the writer is busy inside a call of its own
        thread = threading.Thread(target=reader)
        thread.start()
        thread.join(timeout=20)
        minutes = len({int(s.timestamp_seconds // 60) for s in samples})
        assert not thread.is_alive() and read["series"] == minutes and len(read["gpus"]) == 1

    snapshot = store._reader()  # this thread's reader, inside a read transaction: a long report
    snapshot.execute("BEGIN")
    before = snapshot.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    agent = Agent(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz"), store, CATALOG, host="node-1", clock=CLOCK(h200_trace))
    later = dataclasses.replace(samples[-1], timestamp_seconds=samples[-1].timestamp_seconds + 1.0)
    writer = threading.Thread(target=agent.step, args=([later],))
    writer.start()
    writer.join(timeout=20)
    assert not writer.is_alive()  # committed while the read was open
    assert snapshot.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == before  # the reader's snapshot
    snapshot.execute("COMMIT")
    assert snapshot.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == before + 1
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        snapshot.execute("DELETE FROM samples")  # and a reader writes nothing
