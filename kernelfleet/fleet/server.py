"""The HTTP server: the dashboard, its JSON API, and (for an agent) Prometheus ``/metrics``.

The API's data comes from a backend: the agent and its store on one machine
(:class:`LocalBackend`), or a Prometheus server for a fleet (:class:`PrometheusBackend`).
Served on 127.0.0.1 by default; the CLI refuses another address unless told to,
and then a bearer token can be required on every data request.
"""

from __future__ import annotations

import hmac
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from kernelfleet.catalog import Catalog
from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet import gpu_pages, report, views
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.local_backend import LocalBackend, NotFound
from kernelfleet.fleet.store import Store

DASHBOARD = Path(__file__).parent / "dashboard"
MAX_BODY_BYTES = 256 * 1024  # a hook report is a few kB; nothing the API takes is larger
SERIES_POINTS = 5000  # points of one /api/series answer at most (a day of raw 1-s windows takes 18 pages)
ROWS = 1000  # jobs, job summaries or events in one answer at most
WORST = 100  # the worst GPUs an overview lists at most


class Backend(Protocol):
    def health(self) -> dict[str, Any]: ...
    def fleet(self) -> dict[str, Any]: ...
    def gpu_page(self, limit: int, after: gpu_pages.Key | None) -> gpu_pages.GpuPage: ...
    def overview(self, hosts: Sequence[str], k: int, catalog: Catalog) -> views.Overview: ...
    def series(self, uuid: str, start: float, end: float, resolution: str, metrics: list[str],
               limit: int | None = None) -> list[dict[str, Any]]: ...
    def fleet_series(self, start: float, end: float) -> list[dict[str, Any]]: ...
    def jobs(self, limit: int | None = None) -> list[str]: ...
    def job_summaries(self, since: float, limit: int | None = None) -> list[dict[str, Any]]: ...
    def job(self, job: str) -> dict[str, Any]: ...
    def events(self, since: float, limit: int | None = None) -> list[dict[str, Any]]: ...
    def ofu_grid(self, start: float, end: float, step_seconds: int) -> list[tuple[str, str, int, int | None, int, float | None]]: ...
    def job_seconds_below(self, job: str, ofu_ratio: float) -> dict[tuple[str, int | None], float]: ...
    def hook(self, report: dict[str, Any]) -> dict[str, Any]: ...


class HookReport(BaseModel):
    """What kernelfleet.hook sends (validated: a malformed report is a 422; NaN and Infinity too)."""

    model_config = ConfigDict(allow_inf_nan=False)

    pid: int = Field(gt=0)
    steps: int = Field(ge=1)
    seconds: float = Field(gt=0)
    useful_flops: dict[str, float] = Field(max_length=32)  # by precision: a handful
    # One profiled step's useful and executed (tile-padded) FLOPs, for the tile-corrected OFU,
    # or why the hook has none.
    profiled_useful_flops: dict[str, float] | None = Field(None, max_length=32)
    executed_flops: dict[str, float] | None = Field(None, max_length=32)
    correction_note: str | None = Field(None, max_length=500)
    gemms: list[dict[str, Any]] = Field([], max_length=1024)
    reported_mfu: float | None = Field(None, ge=0, le=2)


class FiniteJSONResponse(JSONResponse):
    """JSON with every NaN or infinity as null: neither is JSON, and a browser's parser refuses it."""

    def render(self, content: Any) -> bytes:
        return json.dumps(_finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class BodyCap:
    """ASGI middleware: a request body over ``max_bytes`` is a 413 and is never held whole, whether
    it declares its length or streams it. A body within the cap is read here, then handed on."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", ())).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                return await self._refuse(send)
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Callable[..., Any]) -> None:
        body = json.dumps({"detail": f"request body over {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def bearer(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case), or None."""
    scheme, _, given = header.strip().partition(" ")
    return given.strip() if scheme.lower() == "bearer" and given.strip() else None


def token_guard(token: str | None) -> Callable[[Request], None]:
    """A FastAPI dependency: with ``token`` set, a request without ``Authorization: Bearer <token>``
    is a 401 (compared in constant time); with None, every request passes."""

    def authorised(request: Request) -> None:
        if token is None:
            return
        given = bearer(request.headers.get("authorization", ""))
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    return authorised


def create_app(backend: Backend, token: str | None = None, metrics: Callable[[], bytes] | None = None,
               api_docs: bool = False, catalog: Catalog | None = None) -> FastAPI:
    """The app; ``token`` set means every data request needs ``Authorization: Bearer <token>``.
    ``api_docs`` serves the OpenAPI schema and its pages (/docs, /redoc), off by default: they map
    the API for anyone who can reach the port, token or not. ``catalog`` prices a job's GPU-hours
    (default: the built-in catalog with ``KERNELFLEET_CATALOG``'s override)."""

    catalog = Catalog.load() if catalog is None else catalog
    docs = {} if api_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="kernelfleet", default_response_class=FiniteJSONResponse, **docs)
    app.add_middleware(BodyCap)
    # A fleet's overview and heatmap are the page's largest answers (JSON of 800 GPUs); compressed
    # they are a tenth of that, for the price of a little CPU: at zlib's own level 6, not
    # Starlette's 9, which took 17 ms against 3.6 for 330 kB of GPU rows (the answer 8 % larger).
    app.add_middleware(GZipMiddleware, minimum_size=4096, compresslevel=6)
    # The page and its static files load without the token (a browser cannot add a header
    # to a page load); everything with data behind it needs it.
    api = APIRouter(dependencies=[Depends(token_guard(token))])
    app.mount("/static", StaticFiles(directory=DASHBOARD), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD / "index.html")

    @app.exception_handler(RequestValidationError)
    def invalid(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input, and a NaN in it would make the 422 a 500
        return FiniteJSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)

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
    def healthz() -> Response:
        health = backend.health()
        return FiniteJSONResponse(health, status_code=200 if health.get("ok", True) else 503)

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

    @api.get("/api/gpus", response_model=gpu_pages.GpuPage)
    def gpus(limit: str | None = Query(None, description=f"Rows at most, 1 to {gpu_pages.MAX_LIMIT} "
                                                          f"(default {gpu_pages.DEFAULT_LIMIT})"),
             after: str | None = Query(None, description="The next_after of the page before")) -> Response:
        try:
            size, start = gpu_pages.parse(limit, after)
        except UsageError as exc:  # a bad parameter of a paged export: a 400 that says which
            raise HTTPException(status_code=400, detail=str(exc)) from None
        # The page was validated when it was made; FastAPI would dump it, validate it again and
        # encode it (~50 ms of CPU for 1,000 rows, more than the backend's own rows took). Pydantic
        # writes a NaN or an infinity as null, as FiniteJSONResponse does.
        return Response(backend.gpu_page(size, start).model_dump_json(), media_type="application/json")

    @api.get("/api/overview")
    def overview(host: Annotated[list[str] | None, Query(description="Hosts whose GPU rows to include (the expanded ones)")] = None,
                 k: int = Query(10, ge=1, le=WORST, description="How many of the worst GPUs")) -> views.Overview:
        return backend.overview(host or [], k, catalog)

    @api.get("/api/heatmap")
    def heatmap(
        start: float | None = Query(None, description="Unix seconds; default: an hour ago"),
        end: float | None = Query(None, description="Unix seconds; default: now"),
    ) -> views.Heatmap:
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        if start > end:
            raise HTTPException(status_code=422, detail="start must not be after end")
        step = views.heatmap_step(start, end)
        return views.heatmap(backend.ofu_grid(start, end, step), start, end, step)

    @api.get("/api/report/{job:path}")
    def job_page(job: str,
                 below_ofu: float = Query(0.3, ge=0, le=1, description="GPU-hours in minutes of OFU below this"),
                 usd_per_gpu_hour: float | None = Query(None, gt=0, description="A price instead of the catalog's")
                 ) -> views.JobPage:
        doc = backend.job(job)
        rows = report.job_report(doc)
        priced = views.prices(catalog, rows.gpus, usd_per_gpu_hour)
        spent = report.spent_below(rows, below_ofu, backend.job_seconds_below(job, below_ofu),
                                   lambda g: None if priced[g.name] is None else priced[g.name].usd_per_hour)
        return views.JobPage(report=rows, spent=spent, prices=priced, timeline_1m=doc["timeline_1m"],
                             timeline_1h=doc.get("timeline_1h", []))

    @api.get("/api/series")
    def series(
        uuid: str,
        start: float | None = Query(None, description="Unix seconds; default: an hour ago"),
        end: float | None = Query(None, description="Unix seconds; default: now"),
        resolution: str = Query("raw", pattern="^(raw|1m|1h)$"),
        metric: Annotated[list[str] | None, Query(description="Columns (default: ofu)")] = None,
        limit: int = Query(SERIES_POINTS, ge=1, le=SERIES_POINTS, description="Points at most; next_start pages on"),
    ) -> dict[str, Any]:
        metric = list(dict.fromkeys(metric or ["ofu"]))  # a metric asked for twice is one column
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        if start > end:
            raise HTTPException(status_code=422, detail="start must not be after end")
        points = backend.series(uuid, start, end, resolution, metric, limit + 1)
        more = len(points) > limit  # one point past the limit says there are more: where the next page starts
        return {"uuid": uuid, "resolution": resolution, "metrics": metric, "points": points[:limit],
                "next_start": points[limit]["ts"] if more else None}

    @api.get("/api/jobs")
    def jobs(limit: int = Query(ROWS, ge=1, le=ROWS)) -> list[str]:
        return backend.jobs(limit)

    @api.get("/api/jobs/summary")
    def job_summaries(minutes: float = Query(15.0, gt=0, le=24 * 60),
                      limit: int = Query(ROWS, ge=1, le=ROWS, description="The least efficient this many")) -> list[dict[str, Any]]:
        return backend.job_summaries(time.time() - 60 * minutes, limit)

    @api.get("/api/jobs/{job:path}")
    def job(job: str) -> dict[str, Any]:
        return backend.job(job)

    @api.get("/api/events")
    def events(since: float = Query(0.0, description="Unix seconds"),
               limit: int = Query(ROWS, ge=1, le=ROWS, description="The newest this many")) -> list[dict[str, Any]]:
        return backend.events(since, limit)

    @api.post("/api/hook")
    def hook(report: HookReport) -> dict[str, Any]:
        return backend.hook(report.model_dump())

    app.include_router(api)
    return app


def _error(status: int, detail: str) -> Response:
    return Response(json.dumps({"detail": detail}), status_code=status, media_type="application/json")


def agent_app(agent: Agent, store: Store | None, token: str | None = None, api_docs: bool = False,
              label_names: str = "kernelfleet", process_series_per_gpu: int = 0) -> FastAPI:
    """An agent's server: its own data, and its readings' exposition at /metrics (label names and
    per-process series as :class:`OfuCollector` takes them)."""
    registry = CollectorRegistry(auto_describe=False)  # its own registry: nothing global
    registry.register(OfuCollector(agent.latest, label_names, process_series_per_gpu))
    return create_app(LocalBackend(agent, store), token, lambda: generate_latest(registry), api_docs, agent.catalog)
