"""The OpenAI-compatible HTTP API over an :class:`~kernelfleet.serve.engine.Engine`.

``POST /v1/completions`` (whole, or ``stream: true`` as server-sent events ending with
``data: [DONE]``), ``GET /v1/models``, ``/healthz`` and ``/metrics`` (Prometheus). A request for
``n`` choices is ``n`` requests in the engine (choice ``i`` samples with ``seed + i``; each
prefills the prompt itself), its chunks tagged with their choice's ``index``; ``stop`` strings
go through ``stops.py``. Every refusal
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
from dataclasses import dataclass

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
from kernelfleet.serve.stops import StopText
from kernelfleet.serve.stream import Detokenizer, Outbox, TokenStream

MAX_BODY_BYTES = 4 * 1024 * 1024  # a long text prompt, or its token ids as JSON
SEEDS = 2**63  # a seed is below this (documents.py); choice i's is seed + i, wrapped


@dataclass(eq=False)
class Chosen:
    """One choice of a completion in the engine: its request, the stream of its tokens and, with
    stop strings, its text through them."""

    request: Request
    stream: TokenStream
    stops: StopText | None


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
        if body.stops and served.tokenizer is None:
            raise Refused(400, f"stop: {served.name} has no tokenizer in its directory, so no text to find a stop "
                          "string in; use stop_token_ids")
        stop = frozenset(body.stop_token_ids) | (frozenset() if body.ignore_eos else served.eos_token_ids)
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        chosen: list[Chosen] = []
        try:
            for index in range(body.n):
                stream = TokenStream(outbox())
                stops = StopText(served.tokenizer, body.stops) if body.stops else None
                sampling = Sampling(body.temperature, body.top_p, (seed + index) % SEEDS)
                chosen.append(Chosen(engine.submit(prompt, body.max_tokens, stop, sampling, stream, stops), stream,
                                     stops))
        except (QueueFull, Closed) as exc:
            for each in chosen:  # a completion is all its choices or none
                engine.cancel(each.request)
            if isinstance(exc, Closed):
                raise Refused(503, str(exc), "server_error") from exc
            engine.metrics.rejected.inc()
            raise Refused(429, str(exc), "rate_limit_error") from exc
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": served.name}
        if body.stream:
            return StreamingResponse(sse_events(engine, chosen, served, head), media_type="text/event-stream")
        return await _whole(engine, chosen, served, head, http)

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


async def _whole(engine: Engine, chosen: list[Chosen], served: Served, head: dict, http: HttpRequest) -> Response:
    tokens: list[list[int]] = [[] for _ in chosen]

    async def gathered() -> None:
        async for index, token, _ in _merged(chosen):
            if token is not None:
                tokens[index].append(token)

    # the body has been read, so the next ASGI message is the client leaving: watch for it beside
    # the tokens, so a client that gives up on a whole answer frees its slots as a streaming one does
    gathering, leaving = asyncio.ensure_future(gathered()), asyncio.ensure_future(http.receive())
    try:
        await asyncio.wait({gathering, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
        if not gathering.done():
            gathering.cancel()
        _cancel_unfinished(engine, chosen)  # the client went away while it waited
    reasons = [each.stream.finish_reason for each in chosen]
    if None in reasons:  # nobody is there to answer
        return Response(status_code=499)
    if ERROR in reasons:
        raise Refused(500, "the model failed on this request (the server's log says why)", "server_error")
    choices = [Choice(index=i, text=_text(each, mine, served), token_ids=mine, finish_reason=each.stream.finish_reason)
               for i, (each, mine) in enumerate(zip(chosen, tokens))]
    prompt = len(chosen[0].request.prompt)
    generated = sum(map(len, tokens))
    usage = Usage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated)
    return JSONResponse(Completion(**head, choices=choices, usage=usage).model_dump())


def _text(chosen: Chosen, tokens: list[int], served: Served) -> str | None:
    if chosen.stops is not None:
        return chosen.stops.whole()
    return served.tokenizer.decode(tokens, skip_special_tokens=True) if served.tokenizer is not None else None


async def _merged(chosen: list[Chosen]) -> AsyncIterator[tuple[int, int | None, str | None]]:
    """Every choice's ``(index, token, finish_reason)`` as they come, until all have finished."""
    if len(chosen) == 1:  # the common case: no task per token
        async for token, reason in chosen[0].stream:
            yield 0, token, reason
        return
    queue: asyncio.Queue[tuple[int, int | None, str | None]] = asyncio.Queue()

    async def pump(index: int, stream: TokenStream) -> None:
        async for token, reason in stream:
            queue.put_nowait((index, token, reason))

    pumps = [asyncio.ensure_future(pump(i, each.stream)) for i, each in enumerate(chosen)]
    try:
        while any(each.stream.finish_reason is None for each in chosen) or not queue.empty():
            yield await queue.get()
    finally:
        for task in pumps:
            task.cancel()


def _cancel_unfinished(engine: Engine, chosen: list[Chosen]) -> None:
    for each in chosen:
        if each.stream.finish_reason is None:
            engine.cancel(each.request)


async def sse_events(engine: Engine, chosen: list[Chosen], served: Served, head: dict) -> AsyncIterator[str]:
    """The server-sent events of a completion's choices: a chunk per token, then ``data: [DONE]``."""
    texts = [Detokenizer(served.tokenizer) for _ in chosen]
    sent = [0] * len(chosen)  # tokens of each choice streamed so far: the index of its next stop piece
    try:
        async for index, token, reason in _merged(chosen):
            if reason == ERROR:
                error = Error(error=ErrorBody(message="the model failed on this request (the server's log says why)",
                                              type="server_error", code=500))
                yield f"data: {error.model_dump_json()}\n\n"
                break
            stops = chosen[index].stops
            if stops is not None:
                text, sent[index] = stops.pieces[sent[index]], sent[index] + 1
            else:
                text = texts[index].add(token, reason is not None)
            choice = Choice(index=index, text=text, token_ids=[token], finish_reason=reason)
            yield f"data: {Completion(**head, choices=[choice]).model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        _cancel_unfinished(engine, chosen)  # the client disconnected mid-stream: its slots go to the next
