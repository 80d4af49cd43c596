"""The agent hands the store a window as columns (store_rows.Batch), not row objects: the columns
it makes are, name by name, the GpuRow fields of its readings, and a store written from them holds
exactly what one written from the rows holds (every table, byte for byte). A batch whose columns
disagree in length is refused in one line."""

import sqlite3
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.fleet.agent import Agent, _batch, attribute_recorded
from kernelfleet.fleet.reading import Reading
from kernelfleet.fleet.store import Batch, GpuRow, JobRow, Store
from kernelfleet.fleet.store_schema import METRICS
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0
DEMO = Path(__file__).resolve().parents[2] / "kernelfleet" / "data" / "demo-h200.jsonl.gz"


def rows_of(readings: list[Reading]) -> tuple[list[GpuRow], list[JobRow]]:
    """The row objects of a window, field by field by name (what the agent wrote before batches)."""
    rows = [GpuRow(host=r.host, uuid=r.sample.uuid, mig_instance=r.sample.mig_instance, gpu_index=r.sample.gpu_index,
                   name=r.sample.name, sku=r.sku.key if r.sku else None, ts=r.sample.timestamp_seconds,
                   window_seconds=r.sample.window_seconds, bottleneck=r.bottleneck, stale=r.sample.stale,
                   ofu=r.ofu.ofu_ratio, tensor_active=r.sample.tensor_active_ratio,
                   sm_clock_hertz=r.sample.sm_clock_mean_hertz, sm_active=r.sample.sm_active_ratio,
                   sm_occupancy=r.sample.sm_occupancy_ratio, dram_bandwidth=r.sample.dram_bandwidth_ratio,
                   power_watts=r.sample.power_mean_watts) for r in readings]
    jobs = [JobRow(j.job, j.kind, j.user, r.host, r.sample.uuid, r.sample.mig_instance, r.sample.timestamp_seconds,
                   j.share, j.approximate) for r in readings for j in r.jobs]
    return rows, jobs


def dump(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}


def test_the_agents_batches_write_the_store_its_rows_would(tmp_path):
    source = ReplaySource(DEMO, rebase_time=True, wall=lambda: NOW)
    agent = Agent(source, None, Catalog.load(), host="node-1", identify=attribute_recorded, clock=lambda: NOW + 300)
    windows = [agent.step(batch) for batch in source.batches(300)]
    stamps = [r.sample.timestamp_seconds for w in windows for r in w]
    assert sum(len(r.jobs) for w in windows for r in w) > 0 and max(stamps) - min(stamps) > 120  # minutes close
    rows, columns = Store(tmp_path / "rows.db"), Store(tmp_path / "columns.db")
    for readings in windows:
        made, expected = _batch(readings), Batch.of(*rows_of(readings))
        assert made == expected  # the same columns, in the same order: the metrics by their names
        rows.write(*rows_of(readings))
        columns.write_batch(made)
    rows.close()
    columns.close()
    assert dump(tmp_path / "columns.db") == dump(tmp_path / "rows.db")


def test_a_batch_whose_columns_disagree_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"needs 1 places in every column and 7 metric columns .* lengths \(1, 1, 1, 1, 0"):
        Batch(("g",), (1.0,), (1.0,), ((),) + ((0.5,),) * (len(METRICS) - 1), ("idle",), (False,))  # type: ignore[arg-type]
