"""The dashboard's data on one machine: the agent's latest readings and its store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.fleet import gpu_pages, views
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.store import Store
from kernelfleet.ofu.aggregate import fleet, summarize


class NotFound(UsageError):
    """A GPU or job the backend has never seen (the API answers 404)."""


class LocalBackend:
    def __init__(self, agent: Agent, store: Store | None) -> None:
        self.agent = agent
        self.store = store

    def _store(self) -> Store:
        if self.store is None:
            raise NotFound("this agent runs without a store")
        return self.store

    def health(self) -> dict[str, Any]:
        """``ok`` false while the sampler is stale (the server answers 503): a probe then acts."""
        stale = self.agent.sampler_stale()
        return {"ok": not stale, "windows": self.agent.windows, "host": self.agent.host, "backend": "local",
                "sampler": "stale: no window lately" if stale else "sampling"}

    def fleet(self) -> dict[str, Any]:
        latest = self.agent.latest()
        summaries = [(summarize([r.sample], r.sku), r.sku) for r in latest if r.sample.mig_instance is None]
        return {**fleet(summaries), "hosts": sorted({r.host for r in latest})}

    def overview(self, hosts: Sequence[str], k: int, catalog: Catalog) -> views.Overview:
        return views.overview(self.gpus(), hosts, k, catalog)

    def gpu_page(self, limit: int, after: gpu_pages.Key | None) -> gpu_pages.GpuPage:
        """A page of :meth:`gpus` in the pages' order (gpu_pages.py)."""
        rows = self.gpus()
        return gpu_pages.page(rows, limit, after, total=len(rows))

    def gpus(self) -> list[dict[str, Any]]:
        return [
            {
                "host": r.host, "gpu": r.sample.gpu_index, "mig_instance": r.sample.mig_instance, "uuid": r.sample.uuid,
                "name": r.sample.name, "sku": r.sku.key if r.sku else None, "timestamp_seconds": r.sample.timestamp_seconds,
                "ofu_ratio": r.ofu.ofu_ratio, "ofu_unavailable_reason": r.ofu.reason,
                "tensor_active_ratio": r.sample.tensor_active_ratio, "sm_clock_hertz": r.sample.sm_clock_mean_hertz,
                "dram_bandwidth_ratio": r.sample.dram_bandwidth_ratio, "power_watts": r.sample.power_mean_watts,
                "bottleneck": r.bottleneck, "stale": r.sample.stale, "stale_reason": r.sample.error,
                "jobs": [{"job": j.job, "kind": j.kind, "user": j.user, "share": j.share, "approximate": j.approximate,
                          "namespace": j.namespace, "pod": j.pod, "container": j.container}
                         for j in r.jobs],
            }
            for r in self.agent.latest()
        ]

    def series(self, uuid: str, start: float, end: float, resolution: str, metrics: list[str],
               limit: int | None = None) -> list[dict[str, Any]]:
        store = self._store()
        if uuid not in {g["uuid"] for g in store.gpus()}:
            raise NotFound(f"no GPU with uuid {uuid!r}")
        return store.series(uuid, start, end, resolution, metrics, limit)

    def fleet_series(self, start: float, end: float) -> list[dict[str, Any]]:
        return self._store().fleet_series(start, end)

    def jobs(self, limit: int | None = None) -> list[str]:
        return self._store().jobs(limit)

    def job_summaries(self, since: float, limit: int | None = None) -> list[dict[str, Any]]:
        return self._store().job_summaries(since, limit)

    def job(self, job: str) -> dict[str, Any]:
        report = self._store().job_report(job)
        if report is None:
            raise NotFound(f"no job {job!r} in the store")
        return {**report, "hook": self.agent.hooks.get(job)}

    def ofu_grid(self, start: float, end: float, step_seconds: int) -> list[tuple[str, str, int, int | None, int, float | None]]:
        return self._store().ofu_grid(start, end, step_seconds)

    def job_seconds_below(self, job: str, ofu_ratio: float) -> dict[tuple[str, int | None], float]:
        return self._store().job_seconds_below(job, ofu_ratio)

    def events(self, since: float, limit: int | None = None) -> list[dict[str, Any]]:
        return self._store().events(since=since, limit=limit)

    def hook(self, report: dict[str, Any]) -> dict[str, Any]:
        return self.agent.hook(report)
