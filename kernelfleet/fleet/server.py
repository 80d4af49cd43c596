"""The HTTP server: the dashboard, its JSON API, and (for an agent) Prometheus ``/metrics``.

The API's data comes from a backend: the agent and its store on one machine
(:class:`LocalBackend`), or a Prometheus server for a fleet (:class:`PrometheusBackend`).
Served on 127.0.0.1 by default; the CLI refuses another address unless told to,
and then a bearer token can be required on every data request.
"""

from __future__ import annotations

import hmac
import json
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.local_backend import LocalBackend, NotFound
from kernelfleet.fleet.store import Store

DASHBOARD = Path(__file__).parent / "dashboard"


class Backend(Protocol):
    def health(self) -> dict[str, Any]: ...
    def fleet(self) -> dict[str, Any]: ...
    def gpus(self) -> list[dict[str, Any]]: ...
    def series(self, uuid: str, start: float, end: float, resolution: str, metrics: list[str]) -> list[dict[str, Any]]: ...
    def fleet_series(self, start: float, end: float) -> list[dict[str, Any]]: ...
    def jobs(self) -> list[str]: ...
    def job_summaries(self, since: float) -> list[dict[str, Any]]: ...
    def job(self, job: str) -> dict[str, Any]: ...
    def events(self, since: float) -> list[dict[str, Any]]: ...
    def hook(self, report: dict[str, Any]) -> dict[str, Any]: ...


class HookReport(BaseModel):
    """What kernelfleet.hook sends (validated: a malformed report is a 422)."""

    pid: int = Field(gt=0)
    steps: int = Field(ge=1)
    seconds: float = Field(gt=0)
    useful_flops: dict[str, float]
    # One profiled step's useful and executed (tile-padded) FLOPs, for the tile-corrected OFU,
    # or why the hook has none.
    profiled_useful_flops: dict[str, float] | None = None
    executed_flops: dict[str, float] | None = None
    correction_note: str | None = Field(None, max_length=500)
    gemms: list[dict[str, Any]] = []
    reported_mfu: float | None = Field(None, ge=0, le=2)


def create_app(backend: Backend, token: str | None = None, metrics: Callable[[], bytes] | None = None) -> FastAPI:
    """The app; ``token`` set means every data request needs ``Authorization: Bearer <token>``."""

    def authorised(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    app = FastAPI(title="kernelfleet")
    # The page and its static files load without the token (a browser cannot add a header
    # to a page load); everything with data behind it needs it.
    api = APIRouter(dependencies=[Depends(authorised)])
    app.mount("/static", StaticFiles(directory=DASHBOARD), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD / "index.html")

    @app.exception_handler(NotFound)
    def not_found(request: Request, exc: NotFound) -> Response:
        return _error(404, str(exc))

    @app.exception_handler(UsageError)
    def bad_input(request: Request, exc: UsageError) -> Response:
        return _error(422, str(exc))

    @app.exception_handler(EnvironmentProblem)
    def upstream(request: Request, exc: EnvironmentProblem) -> Response:
        return _error(502, str(exc))

    if metrics is not None:
        @api.get("/metrics")
        def exposition() -> Response:
            return Response(metrics(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/healthz")
    def healthz() -> dict[str, Any]:
        return backend.health()

    @api.get("/api/fleet")
    def fleet() -> dict[str, Any]:
        return backend.fleet()

    @api.get("/api/fleet/series")
    def fleet_series(
        start: float | None = Query(None, description="Unix seconds; default: a day ago"),
        end: float | None = Query(None, description="Unix seconds; default: now"),
    ) -> dict[str, Any]:
        end = time.time() if end is None else end
        start = end - 86400 if start is None else start
        if start > end:
            raise HTTPException(status_code=422, detail="start must not be after end")
        return {"resolution": "1m", "points": backend.fleet_series(start, end)}

    @api.get("/api/gpus")
    def gpus() -> list[dict[str, Any]]:
        return backend.gpus()

    @api.get("/api/series")
    def series(
        uuid: str,
        start: float | None = Query(None, description="Unix seconds; default: an hour ago"),
        end: float | None = Query(None, description="Unix seconds; default: now"),
        resolution: str = Query("raw", pattern="^(raw|1m|1h)$"),
        metric: list[str] = Query(["ofu"]),
    ) -> dict[str, Any]:
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        if start > end:
            raise HTTPException(status_code=422, detail="start must not be after end")
        points = backend.series(uuid, start, end, resolution, metric)
        return {"uuid": uuid, "resolution": resolution, "metrics": metric, "points": points}

    @api.get("/api/jobs")
    def jobs() -> list[str]:
        return backend.jobs()

    @api.get("/api/jobs/summary")
    def job_summaries(minutes: float = Query(15.0, gt=0, le=24 * 60)) -> list[dict[str, Any]]:
        return backend.job_summaries(since=time.time() - 60 * minutes)

    @api.get("/api/jobs/{job:path}")
    def job(job: str) -> dict[str, Any]:
        return backend.job(job)

    @api.get("/api/events")
    def events(since: float = Query(0.0, description="Unix seconds")) -> list[dict[str, Any]]:
        return backend.events(since)

    @api.post("/api/hook")
    def hook(report: HookReport) -> dict[str, Any]:
        return backend.hook(report.model_dump())

    app.include_router(api)
    return app


def _error(status: int, detail: str) -> Response:
    return Response(json.dumps({"detail": detail}), status_code=status, media_type="application/json")


def agent_app(agent: Agent, store: Store | None, token: str | None = None) -> FastAPI:
    """An agent's server: its own data, and its readings' exposition at /metrics."""
    registry = CollectorRegistry(auto_describe=False)  # its own registry: nothing global
    registry.register(OfuCollector(agent.latest))
    return create_app(LocalBackend(agent, store), token, lambda: generate_latest(registry))
