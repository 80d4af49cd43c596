"""The store's writer: a window batch (its raw rows and which jobs held its GPUs) in one
transaction, so a crash loses at most the batch being written; the minutes it closed are rolled up
in the same transaction (store_roll.py)."""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Sequence

from kernelfleet.fleet import store_roll
from kernelfleet.fleet.store_lock import transaction
from kernelfleet.fleet.store_rows import GpuRow, JobRow
from kernelfleet.fleet.store_schema import BOTTLENECKS, KEY, METRICS, OPEN, floor

# ?1 gpu_id, ?2 ts, ?3 window_seconds, the metrics, bottleneck, stale; the key made of ?2 and ?1
_INSERT_SAMPLE = (f"INSERT OR REPLACE INTO samples VALUES ({KEY.replace(':ts', '?2').replace(':gpu_id', '?1')}, "
                  f"{', '.join(f'?{i}' for i in range(1, 6 + len(METRICS)))})")
_CODES = {name: i for i, name in enumerate(BOTTLENECKS)}
_UNKNOWN = BOTTLENECKS.index("unknown")
_NONE: dict = {}  # a GPU no job holds
_ROW_VALUES = operator.attrgetter("ts", "window_seconds", *METRICS)


class Writer:
    """The writing half of a store, on the writer's own connection (the caller serialises calls).

    It remembers the ids it gave GPUs and jobs, and the holds it has open: gpu_id -> job_id ->
    (share, approximate), and where each began. A hold's end reaches the file when it closes, not
    at every window.
    """

    def __init__(self, db: sqlite3.Connection, rolled_until: int | None) -> None:
        self.db = db
        self.rolled_until = rolled_until
        self._gpu_ids: dict[tuple[str, str, int], int] = {}
        self._job_ids: dict[str, tuple[int, str, str | None]] = {}
        self._holds: dict[int, dict[int, tuple[float, bool]]] = {}
        self._since: dict[tuple[int, int], float] = {}
        self._newest: dict[int, float] = {}  # each GPU's newest window written here
        self._holds_adopted = False

    def write(self, rows: Sequence[GpuRow], jobs: Sequence[JobRow]) -> None:
        """Write one window batch in one transaction; roll up the minutes it closed."""
        if not rows:
            return
        with transaction(self.db):
            if not self._holds_adopted:
                # holds a writer before this one left open (a crash) end at the newest window on file
                self.db.execute("UPDATE holds SET until = MAX(since, COALESCE((SELECT ts FROM samples ORDER BY key DESC "
                                "LIMIT 1), since)) WHERE until = ?", (OPEN,))
                self._holds_adopted = True
            ids = [self._gpu_id(r) for r in rows]
            self.db.executemany(_INSERT_SAMPLE, [(i, *_ROW_VALUES(r), _CODES.get(r.bottleneck, _UNKNOWN), r.stale)
                                                 for i, r in zip(ids, rows)])
            self._hold(ids, rows, jobs)
            minute = floor(max(r.ts for r in rows), 60)
            if self.rolled_until is None:
                # Nothing rolled yet: start at the oldest window on file, not this batch's. A first
                # writer stopped (or killed) before its first minute closed left windows behind that
                # the next writer would otherwise never roll (the fault campaign found it).
                oldest = self.db.execute("SELECT ts FROM samples ORDER BY key LIMIT 1").fetchone()[0]
                self.rolled_until = floor(oldest, 60)  # this batch is on file already
            if minute > self.rolled_until:
                store_roll.roll(self.db, self.rolled_until, minute)
                self.rolled_until = minute

    def close_holds(self) -> None:
        """End the open holds at their GPUs' last windows (a clean stop)."""
        with transaction(self.db):
            for gpu, spans in self._holds.items():
                for job_id in spans:
                    self._close_hold(gpu, job_id, self._newest[gpu])
        self._holds.clear()

    def forget_jobs(self) -> None:
        """Retention deleted jobs: their ids are no longer on file."""
        self._job_ids.clear()

    def add_event(self, ts: float, kind: str, detail: str, gpu_uuid: str | None, job: str | None) -> None:
        gpu_id = None
        if gpu_uuid is not None:
            found = self.db.execute("SELECT gpu_id FROM gpus WHERE uuid = ?", (gpu_uuid,)).fetchone()
            gpu_id = found[0] if found else None
        self.db.execute("INSERT INTO events (ts, kind, gpu_id, job, detail) VALUES (?, ?, ?, ?, ?)",
                        (ts, kind, gpu_id, job, detail))

    def _hold(self, ids: Sequence[int], rows: Sequence[GpuRow], jobs: Sequence[JobRow]) -> None:
        """Open or close the holds of the batch's GPUs where their jobs changed. A window no newer
        than its GPU's newest (late, or written again) changes no hold."""
        held: dict[int, dict[int, tuple[float, bool]]] = {}
        for j in jobs:
            gpu = self._gpu_ids[(j.host, j.uuid, -1 if j.mig_instance is None else j.mig_instance)]
            held.setdefault(gpu, {})[self._job_id(j)] = (j.share, j.approximate)
        for gpu, r in zip(ids, rows):
            last = self._newest.get(gpu)
            if last is not None and r.ts <= last:
                continue
            self._newest[gpu] = r.ts
            now, spans = held.get(gpu, _NONE), self._holds.get(gpu, _NONE)
            if now == spans:  # the same jobs at the same shares: every open hold goes on, in memory
                continue
            for job_id, kept in spans.items():
                if now.get(job_id) != kept:
                    self._close_hold(gpu, job_id, last)
            for job_id, (share, approximate) in now.items():
                if spans.get(job_id) != (share, approximate):
                    self.db.execute("INSERT OR REPLACE INTO holds VALUES (?, ?, ?, ?, ?, ?)",
                                    (job_id, gpu, r.ts, OPEN, share, int(approximate)))
                    self._since[gpu, job_id] = r.ts
            self._holds[gpu] = now

    def _close_hold(self, gpu: int, job_id: int, until: float) -> None:
        self.db.execute("UPDATE holds SET until = ? WHERE gpu_id = ? AND since = ? AND job_id = ?",
                        (until, gpu, self._since.pop((gpu, job_id)), job_id))

    def _job_id(self, j: JobRow) -> int:
        found = self._job_ids.get(j.job)
        if found is None or found[1] != j.kind or found[2] != j.user:
            self.db.execute("INSERT INTO jobs (name, kind, user) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                            "kind = excluded.kind, user = COALESCE(excluded.user, user)", (j.job, j.kind, j.user))
            job_id = self.db.execute("SELECT job_id FROM jobs WHERE name = ?", (j.job,)).fetchone()[0]
            found = self._job_ids[j.job] = (job_id, j.kind, j.user)
        return found[0]

    def _gpu_id(self, r: GpuRow) -> int:
        key = (r.host, r.uuid, -1 if r.mig_instance is None else r.mig_instance)
        found = self._gpu_ids.get(key)
        if found is None:
            self.db.execute(
                "INSERT INTO gpus (host, uuid, mig_instance, gpu_index, name, sku) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (host, uuid, mig_instance) DO UPDATE SET gpu_index = excluded.gpu_index, "
                "name = excluded.name, sku = excluded.sku",
                (*key, r.gpu_index, r.name, r.sku),
            )
            found = self._gpu_ids[key] = self.db.execute(
                "SELECT gpu_id FROM gpus WHERE host = ? AND uuid = ? AND mig_instance = ?", key
            ).fetchone()[0]
        return found
