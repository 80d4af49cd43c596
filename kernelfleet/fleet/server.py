"""The agent's HTTP server: Prometheus ``/metrics`` and a JSON API (the dashboard's data).

Served on 127.0.0.1 by default; the CLI refuses another address unless told to,
and then a bearer token can be required on every request.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kernelfleet.errors import UsageError
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.store import METRICS, Store


def create_app(agent: Agent, store: Store | None, token: str | None = None) -> FastAPI:
    """The app; ``token`` set means every request needs ``Authorization: Bearer <token>``."""

    def authorised(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    app = FastAPI(title="kernelfleet agent", dependencies=[Depends(authorised)])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OfuCollector(agent.latest))

    def need_store() -> Store:
        if store is None:
            raise HTTPException(status_code=404, detail="this agent runs without a store")
        return store

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "windows": agent.windows, "host": agent.host}

    @app.get("/api/gpus")
    def gpus() -> list[dict[str, Any]]:
        return [
            {
                "host": r.host, "gpu": r.sample.gpu_index, "mig_instance": r.sample.mig_instance, "uuid": r.sample.uuid,
                "name": r.sample.name, "sku": r.sku.key if r.sku else None, "timestamp_seconds": r.sample.timestamp_seconds,
                "ofu_ratio": r.ofu.ofu_ratio, "ofu_unavailable_reason": r.ofu.reason,
                "tensor_active_ratio": r.sample.tensor_active_ratio, "sm_clock_hertz": r.sample.sm_clock_mean_hertz,
                "dram_bandwidth_ratio": r.sample.dram_bandwidth_ratio, "power_watts": r.sample.power_mean_watts,
                "bottleneck": r.bottleneck, "stale": r.sample.stale,
                "jobs": [{"job": j.job, "kind": j.kind, "user": j.user, "share": j.share, "approximate": j.approximate}
                         for j in r.jobs],
            }
            for r in agent.latest()
        ]

    @app.get("/api/series")
    def series(
        uuid: str,
        start: float | None = Query(None, description="Unix seconds; default: an hour ago"),
        end: float | None = Query(None, description="Unix seconds; default: now"),
        resolution: str = Query("raw", pattern="^(raw|1m|1h)$"),
        metric: list[str] = Query(["ofu"]),
    ) -> dict[str, Any]:
        db = need_store()
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        if start > end:
            raise HTTPException(status_code=422, detail="start must not be after end")
        if uuid not in {g["uuid"] for g in db.gpus()}:
            raise HTTPException(status_code=404, detail=f"no GPU with uuid {uuid!r}")
        try:
            points = db.series(uuid, start, end, resolution, metric)
        except UsageError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        return {"uuid": uuid, "resolution": resolution, "metrics": metric, "points": points, "known_metrics": list(METRICS)}

    @app.get("/api/jobs")
    def jobs() -> list[str]:
        return need_store().jobs()

    @app.get("/api/jobs/{job:path}")
    def job(job: str) -> dict[str, Any]:
        report = need_store().job_report(job)
        if report is None:
            raise HTTPException(status_code=404, detail=f"no job {job!r} in the store")
        return report

    @app.get("/api/events")
    def events(since: float = Query(0.0, description="Unix seconds")) -> list[dict[str, Any]]:
        return need_store().events(since=since)

    return app
