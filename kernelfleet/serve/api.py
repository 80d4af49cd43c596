"""The OpenAI-compatible HTTP API over an :class:`~kernelfleet.serve.engine.Engine`.

``POST /v1/completions`` (whole, or ``stream: true`` as server-sent events ending with
``data: [DONE]``), ``GET /v1/models``, ``/healthz`` and ``/metrics`` (Prometheus). Every refusal
is one line in OpenAI's error shape: a malformed or unknown field, a prompt that does not fit the
context or ``max_tokens`` past the cache are 400, an unknown model 404, a full queue 429, a stopped
loop 503. A client that goes away, mid-stream or while it waits for a whole answer, cancels its
request, and the engine frees its slot at its next step. With a token, every route needs
``Authorization: Bearer <token>``, as the agent's API does.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from kernelfleet.fleet.server import BodyCap, token_guard
from kernelfleet.serve.documents import (
    Choice,
    Completion,
    CompletionRequest,
    Error,
    ErrorBody,
    ModelCard,
    ModelList,
    Usage,
)
from kernelfleet.serve.engine import ERROR, Closed, Engine, Request
from kernelfleet.serve.model import Served
from kernelfleet.serve.sampling import Sampling
from kernelfleet.serve.scheduler import QueueFull
from kernelfleet.serve.stream import Detokenizer, Outbox, TokenStream

MAX_BODY_BYTES = 4 * 1024 * 1024  # a long text prompt, or its token ids as JSON


class Refused(Exception):
    """A request the API answers with ``status`` and ``message`` instead of tokens."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def refusal(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    body = Error(error=ErrorBody(message=message, type=kind, code=status))
    return JSONResponse(body.model_dump(), status_code=status)


def serve_app(engine: Engine, served: Served, token: str | None = None) -> FastAPI:
    """The app over a started ``engine`` serving ``served``."""
    app = FastAPI(title="kernelfleet serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyCap, max_bytes=MAX_BODY_BYTES)
    api = APIRouter(dependencies=[Depends(token_guard(token))])
    created = int(time.time())
    outboxes: list[Outbox] = []  # the one of the loop serving now (uvicorn runs one)

    def outbox() -> Outbox:
        loop = asyncio.get_running_loop()
        if not outboxes or outboxes[0].loop is not loop:
            outboxes[:] = [Outbox(loop)]
        return outboxes[0]

    @app.exception_handler(RequestValidationError)
    def invalid(request, exc: RequestValidationError) -> Response:
        return refusal(400, "; ".join(_problem(e) for e in exc.errors()))

    @app.exception_handler(Refused)
    def refused(request, exc: Refused) -> Response:
        return refusal(exc.status, exc.message, exc.kind)

    @api.get("/v1/models")
    def models() -> ModelList:
        return ModelList(data=[ModelCard(id=served.name, created=created, max_model_len=engine.context_tokens)])

    @api.get("/healthz")
    def healthz() -> Response:
        alive = engine.alive()
        return JSONResponse({"ok": alive, "model": served.name, "slots": engine.slots,
                             "running": len(engine.scheduler.running), "waiting": len(engine.scheduler.waiting)},
                            status_code=200 if alive else 503)

    @api.get("/metrics")
    def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @api.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, http: HttpRequest) -> Response:
        prompt = _prompt(body, served, engine.context_tokens)
        stop = frozenset(body.stop_token_ids) | (frozenset() if body.ignore_eos else served.eos_token_ids)
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        stream = TokenStream(outbox())
        try:
            request = engine.submit(prompt, body.max_tokens, stop, Sampling(body.temperature, body.top_p, seed),
                                    stream)
        except QueueFull as exc:
            engine.metrics.rejected.inc()
            raise Refused(429, str(exc), "rate_limit_error") from exc
        except Closed as exc:
            raise Refused(503, str(exc), "server_error") from exc
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": served.name}
        if body.stream:
            return StreamingResponse(sse_events(engine, request, stream, served, head), media_type="text/event-stream")
        return await _whole(engine, request, stream, served, head, http)

    app.include_router(api)
    return app


def _problem(error: dict) -> str:
    where = ".".join(str(part) for part in error["loc"][1:]) or "body"
    if error["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if error["type"] == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', error['msg'])})"
    return f"{where}: {error['msg']}"


def _prompt(body: CompletionRequest, served: Served, context_tokens: int) -> list[int]:
    if body.model is not None and body.model != served.name:
        raise Refused(404, f"model {body.model!r} is not served here; this server serves {served.name!r}",
                      "not_found_error")
    if isinstance(body.prompt, str):
        if served.tokenizer is None:
            raise Refused(400, f"{served.name} has no tokenizer in its directory: send the prompt as token ids")
        prompt = served.tokenizer.encode(body.prompt)
    else:
        prompt = body.prompt
        outside = [t for t in prompt if t >= served.vocab_size]
        if outside:
            raise Refused(400, f"prompt: token id {outside[0]} is outside the vocabulary (0 to {served.vocab_size - 1})")
    if len(prompt) >= context_tokens:
        raise Refused(400, f"the prompt's {len(prompt)} tokens do not fit the context of {context_tokens} tokens "
                      "(and leave none to generate)")
    if len(prompt) + body.max_tokens > context_tokens:
        raise Refused(400, f"max_tokens {body.max_tokens} is past the cache: the prompt's {len(prompt)} tokens "
                      f"leave {context_tokens - len(prompt)} of the context's {context_tokens}")
    return prompt


async def _whole(engine: Engine, request: Request, stream: TokenStream, served: Served, head: dict,
                 http: HttpRequest) -> Response:
    tokens: list[int] = []

    async def gathered() -> None:
        async for token, _ in stream:
            if token is not None:
                tokens.append(token)

    # the body has been read, so the next ASGI message is the client leaving: watch for it beside
    # the tokens, so a client that gives up on a whole answer frees its slot as a streaming one does
    gathering, leaving = asyncio.ensure_future(gathered()), asyncio.ensure_future(http.receive())
    try:
        await asyncio.wait({gathering, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
        if not gathering.done():
            gathering.cancel()
        if stream.finish_reason is None:  # the client went away while it waited
            engine.cancel(request)
    if stream.finish_reason is None:  # nobody is there to answer
        return Response(status_code=499)
    if stream.finish_reason == ERROR:
        raise Refused(500, "the model failed on this request (the server's log says why)", "server_error")
    text = served.tokenizer.decode(tokens, skip_special_tokens=True) if served.tokenizer is not None else None
    choice = Choice(text=text, token_ids=tokens, finish_reason=stream.finish_reason)
    usage = Usage(prompt_tokens=len(request.prompt), completion_tokens=len(tokens),
                  total_tokens=len(request.prompt) + len(tokens))
    return JSONResponse(Completion(**head, choices=[choice], usage=usage).model_dump())


async def sse_events(engine: Engine, request: Request, stream: TokenStream, served: Served,
                     head: dict) -> AsyncIterator[str]:
    """The server-sent events of ``request``: a chunk per token, then ``data: [DONE]``."""
    text = Detokenizer(served.tokenizer)
    try:
        async for token, reason in stream:
            if reason == ERROR:
                error = Error(error=ErrorBody(message="the model failed on this request (the server's log says why)",
                                              type="server_error", code=500))
                yield f"data: {error.model_dump_json()}\n\n"
                break
            choice = Choice(text=text.add(token, reason is not None), token_ids=[token], finish_reason=reason)
            yield f"data: {Completion(**head, choices=[choice]).model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if stream.finish_reason is None:  # the client disconnected mid-stream: its slot goes to the next
            engine.cancel(request)
