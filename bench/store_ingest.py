"""Benchmark: store ingest rate and rollup query time (issue 3 targets: >= 50,000 samples/s
on a 2-core machine; a 1,000-GPU x 24-h query at 1-minute rollup <= 300 ms).

    python3 bench/store_ingest.py [--gpus 1000] [--windows 60]

Writes ``--windows`` batches of ``--gpus`` rows (one row per GPU per window) into a
fresh store, the way the agent does (one transaction a batch, raw rows and both
rollups), and reports rows per second. Baseline in the same run: the same rows
written as raw rows only, with no rollups.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from kernelfleet.fleet.store import GpuRow, Store, _transaction


def rows(gpus: int, window: int) -> list[GpuRow]:
    rnd = random.Random(window)
    return [
        GpuRow(host=f"node-{g // 8}", uuid=f"GPU-{g:05d}", mig_instance=None, gpu_index=g % 8, name="NVIDIA H200",
               sku="h200-sxm", ts=1.8e9 + window, window_seconds=1.0, bottleneck="tensor-bound", stale=False,
               ofu=rnd.random(), tensor_active=rnd.random(), sm_clock_hertz=1.4e9, sm_active=0.9, sm_occupancy=0.2,
               dram_bandwidth=0.3, power_watts=650.0)
        for g in range(gpus)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--windows", type=int, default=60)
    args = parser.parse_args()
    print(f"command: {' '.join([sys.executable] + sys.argv)}")
    batches = [rows(args.gpus, w) for w in range(args.windows)]
    total = args.gpus * args.windows
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "kf.db")
        store.write(batches[0])  # registers the GPUs
        t0 = time.perf_counter()
        for batch in batches[1:]:
            store.write(batch)
        full = (total - args.gpus) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(5):
            for g in range(0, args.gpus, max(1, args.gpus // 20)):
                store.series(f"GPU-{g:05d}", 0, 2e9, "1m", ["ofu"])
        per_query = (time.perf_counter() - t0) / (5 * len(range(0, args.gpus, max(1, args.gpus // 20))))
        base = Store(Path(tmp) / "raw.db")
        base.write(batches[0])
        t0 = time.perf_counter()
        for batch in batches[1:]:
            with _transaction(base.db):
                base.db.executemany(
                    "INSERT OR REPLACE INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(i + 1, r.ts, 1.0, r.ofu, r.tensor_active, r.sm_clock_hertz, r.sm_active, r.sm_occupancy,
                      r.dram_bandwidth, r.power_watts, r.bottleneck, 0) for i, r in enumerate(batch)],
                )
        raw_only = (total - args.gpus) / (time.perf_counter() - t0)
    print(f"{'what':44} {'value':>14}")
    print(f"{'ingest, raw + 1m + 1h rollups (rows/s)':44} {full:>14,.0f}")
    print(f"{'baseline: raw rows only (rows/s)':44} {raw_only:>14,.0f}")
    print(f"{'one GPU 1m-rollup series query (ms)':44} {per_query * 1000:>14.2f}")


if __name__ == "__main__":
    main()
