"""The agent's HTTP server: Prometheus ``/metrics`` and a JSON API (the dashboard's data).

Served on 127.0.0.1 by default; the CLI refuses another address unless told to,
and then a bearer token can be required on every request.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kernelfleet.errors import UsageError
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.store import METRICS, Store
from kernelfleet.ofu.aggregate import fleet, summarize

DASHBOARD = Path(__file__).parent / "dashboard"


def create_app(agent: Agent, store: Store | None, token: str | None = None) -> FastAPI:
    """The app; ``token`` set means every request needs ``Authorization: Bearer <token>``."""

    def authorised(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    app = FastAPI(title="kernelfleet agent")
    # The page and its static files load without the token (a browser cannot add a header
    # to a page load); everything with data behind them needs it.
    api = APIRouter(dependencies=[Depends(authorised)])
    app.mount("/static", StaticFiles(directory=DASHBOARD), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD / "index.html")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(OfuCollector(agent.latest))

    def need_store() -> Store:
        if store is None:
            raise HTTPException(status_code=404, detail="this agent runs without a store")
        return store

    @api.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "windows": agent.windows, "host": agent.host}

    @api.get("/api/fleet")
    def fleet_view() -> dict[str, Any]:
        latest = agent.latest()
        summaries = [(summarize([r.sample], r.sku), r.sku) for r in latest if r.sample.mig_instance is None]
        return {**fleet(summaries), "hosts": sorted({r.host for r in latest})}

    @api.get("/api/gpus")
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

    @api.get("/api/series")
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

    @api.get("/api/jobs")
    def jobs() -> list[str]:
        return need_store().jobs()

    @api.get("/api/jobs/summary")
    def job_summaries(minutes: float = Query(15.0, gt=0, le=24 * 60)) -> list[dict[str, Any]]:
        return need_store().job_summaries(since=time.time() - 60 * minutes)

    @api.get("/api/jobs/{job:path}")
    def job(job: str) -> dict[str, Any]:
        report = need_store().job_report(job)
        if report is None:
            raise HTTPException(status_code=404, detail=f"no job {job!r} in the store")
        return report

    @api.get("/api/events")
    def events(since: float = Query(0.0, description="Unix seconds")) -> list[dict[str, Any]]:
        return need_store().events(since=since)

    app.include_router(api)
    return app
