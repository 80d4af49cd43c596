"""Benchmark: the agent's performance targets from issue 3, in one run (CPU only).

    python -m bench.agent_perf

1. Store ingest, rows/s (target >= 50,000 on this 2-core machine): the agent's write of a window
   batch with its jobs; baseline in the same run: the raw rows alone into a bare table.
2. Dashboard query: fleet OFU over 24 h at 1-minute rollup for 1,000 GPUs (target <= 300 ms).
3. /metrics for 8 GPUs (target <= 10 ms).
4. Agent memory over a 1-hour replay at 100x (target: flat).
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import socket
import sqlite3
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry, generate_latest

from bench import command_line
from bench.fleet_scale import gpu_row as row
from bench.fleet_scale import job_row as job
from kernelfleet.catalog import Catalog
from kernelfleet.fleet import store_roll
from kernelfleet.fleet.agent import Agent, attribute_recorded
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.server import agent_app
from kernelfleet.fleet.store import Store
from kernelfleet.fleet.store_lock import transaction
from kernelfleet.telemetry.replay import ReplaySource

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "kernelfleet" / "data" / "demo-h200.jsonl.gz"


def ingest(tmp: Path) -> tuple[float, float]:
    """The agent's write of a window batch (raw rows and the jobs that hold them, one transaction),
    against the raw insert alone: rows as wide into a bare table, one transaction a window."""
    store = Store(tmp / "ingest.db")
    batches = [[row(g, 1.8e9 + w) for g in range(1000)] for w in range(121)]
    jobs = [[job(g, 1.8e9 + w) for g in range(1000)] for w in range(121)]
    store.write(batches[0], jobs[0])
    t0 = time.perf_counter()
    for batch, held in zip(batches[1:], jobs[1:]):
        store.write(batch, held)
    full = 120_000 / (time.perf_counter() - t0)
    base = sqlite3.connect(tmp / "raw.db", isolation_level=None)
    base.execute("PRAGMA journal_mode=WAL")
    base.execute("PRAGMA synchronous=NORMAL")
    base.execute("CREATE TABLE samples (gpu_id, ts, window_seconds, ofu, tensor_active, sm_clock_hertz, sm_active, "
                 "sm_occupancy, dram_bandwidth, power_watts, bottleneck, stale)")
    t0 = time.perf_counter()
    for batch in batches[1:]:
        with transaction(base):
            base.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             [(i + 1, r.ts, 1.0, r.ofu, r.tensor_active, r.sm_clock_hertz, r.sm_active,
                               r.sm_occupancy, r.dram_bandwidth, r.power_watts, 1, 0)
                              for i, r in enumerate(batch)])
    return full, 120_000 / (time.perf_counter() - t0)


def fleet_query(tmp: Path) -> float:
    """1,000 GPUs x 1,440 minutes of 1-minute rollups, written directly, then the fleet query."""
    store = Store(tmp / "day.db")
    store.write([row(g, 1.8e9) for g in range(1000)])  # registers the GPUs
    start = int(1.8e9 // 60) * 60
    cols = 2 + 2 * 7 + 2
    with transaction(store.db):
        store.db.executemany(f"INSERT OR REPLACE INTO rollup_1m VALUES ({', '.join('?' * cols)})",
                             ((g + 1, start + 60 * m, 60.0, 0.0, *([30.0, 60.0] * 7)) for m in range(1440) for g in range(1000)))
        store_roll.roll(store.db, start, start + 86400)  # what the agent does minute by minute, done at once
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        points = store.fleet_series(start, start + 86400 - 60)
        times.append(time.perf_counter() - t0)
    assert len(points) == 1440 and points[0]["gpus"] == 1000
    return statistics.median(times)


def metrics_8_gpus() -> tuple[float, float]:
    """A real uvicorn server on loopback, scraped 50 times; and the exposition alone."""
    source = ReplaySource(DEMO)
    (sample,) = next(source.batches())
    agent = Agent(source, None, Catalog.load(), identify=attribute_recorded, clock=lambda: sample.timestamp_seconds)
    agent.step([dataclasses.replace(sample, gpu_index=i, uuid=f"GPU-{i}") for i in range(8)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(agent_app(agent, None), host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/metrics"
    urllib.request.urlopen(url).read()
    through_http, alone = [], []
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OfuCollector(agent.latest))
    for _ in range(50):
        t0 = time.perf_counter()
        urllib.request.urlopen(url).read()
        through_http.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        generate_latest(registry)
        alone.append(time.perf_counter() - t0)
    server.should_exit = True
    return statistics.median(through_http), statistics.median(alone)


def memory_over_an_hour(tmp: Path) -> list[float]:
    source = ReplaySource(DEMO, speed=100.0, loop=True, sleep=lambda s: None)
    now = [0.0]  # the agent's clock follows the hour as it is fed, faster than real time
    agent = Agent(source, Store(tmp / "hour.db"), Catalog.load(), identify=attribute_recorded, clock=lambda: now[0])
    rss = []
    for i, batch in enumerate(source.batches(count=3600)):
        now[0] = batch[0].timestamp_seconds
        agent.step(batch)
        if i % 600 == 599:
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return rss


def main() -> None:
    logging.disable(logging.WARNING)  # the replay's regressions would flood the table
    print(f"command: {command_line()}")
    with tempfile.TemporaryDirectory() as tmp:
        full, raw = ingest(Path(tmp))
        query = fleet_query(Path(tmp))
        metrics, exposition = metrics_8_gpus()
        rss = memory_over_an_hour(Path(tmp))
    print(f"{'measure':58} {'value':>12} {'target':>10}")
    print(f"{'store ingest, raw + jobs + rollups (rows/s)':58} {full:>12,.0f} {'>= 50,000':>10}")
    print(f"{'  baseline in the same run: raw insert only (rows/s)':58} {raw:>12,.0f}")
    print(f"{'fleet OFU, 1,000 GPUs x 24 h at 1-min rollup (ms)':58} {query * 1000:>12.1f} {'<= 300':>10}")
    print(f"{'/metrics for 8 GPUs, uvicorn on loopback (ms)':58} {metrics * 1000:>12.2f} {'<= 10':>10}")
    print(f"{'  of which the exposition itself (ms)':58} {exposition * 1000:>12.2f}")
    print(f"{'agent max RSS every 10 min of a 1-h replay at 100x (MiB)':58} {' '.join(f'{r:.0f}' for r in rss):>12}")


if __name__ == "__main__":
    main()
