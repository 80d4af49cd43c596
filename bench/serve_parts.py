"""Benchmark: where the server's time per streamed token goes, part by part, before and after the
hand-off and text fixes (``python -m bench.serve_cpu --parts``; the module docstring of
bench/serve_cpu.py has the rest).

    python -m bench.serve_cpu --parts [--part-tokens 2000] [--repeats 5] [--quick]

The backend is :class:`FreeStep`: fixed logits, no model, so its step costs nothing and what is
left per token is the serving path's own cost. One streaming request at batch 1, ``--part-tokens``
tokens; each row adds one part to the one above it, in one process but the client:

1. the engine stepped in this thread, a sink that does nothing;
2. + its thread handing each token to an asyncio loop, a consumer there awaiting it;
3. + the server-sent event of each token: its text (a word tokenizer: one word a token) and the
   chunk's JSON;
4. + HTTP: the real app on uvicorn over loopback; the client, in its own process, reads raw bytes;
5. the same with the client an httpx stream parsing each chunk (``aiter_lines`` + ``json.loads``):
   the difference to 4 is the client's share, not the server's;
6. the engine on :class:`WaitingStep`, a step of 7 ms that waits with the GIL released (the 8B's
   step on an H200: its engine thread waits for the GPU), at most 200 tokens;
7. that over HTTP with the raw client: 7 - 6 is what the serving path adds to a GPU-like step.

"before" runs the same with the stream and detokenizer this change replaced (:class:`BeforeStream`:
one ``call_soon_threadsafe`` a token; :class:`BeforeDetokenizer`: the whole text decoded again every
token), kept here as the baseline; "after" is the product as it is. Rounds interleave before and
after, each going first as often; medians of ``--repeats``. The JSON of the table is the last line.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from unittest import mock

import torch

from bench import Parser, command_line
from kernelfleet.serve import api
from kernelfleet.serve.stream import REPLACEMENT, Outbox, TokenStream

VOCAB = 256
TOKEN = 7  # the one token FreeStep answers
# the 8B Llama's decode step at batch 1 on one H200 (docs/validation/serve-gpu.md: 7.0 ms)
GPU_STEP_SECONDS, GPU_STEP_TOKENS = 0.007, 200


class FreeStep:
    """A backend whose forwards cost nothing: the same logits every time (this benchmark only)."""

    device = "free"

    def __init__(self, slots: int, context_tokens: int) -> None:
        self.slots, self.context_tokens = slots, context_tokens
        self.logits = torch.zeros(1, VOCAB)
        self.logits[0, TOKEN] = 1.0

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        return self.logits[0]

    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor:
        return self.logits.expand(len(slots), VOCAB)


class WaitingStep(FreeStep):
    """A backend whose step waits ``seconds`` with the GIL released, as the engine's thread waits
    for a GPU's decode (graph replay, then the host read of its arg max), then gives fixed logits."""

    def __init__(self, slots: int, context_tokens: int, seconds: float) -> None:
        super().__init__(slots, context_tokens)
        self.seconds = seconds

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        time.sleep(self.seconds)
        return super().prefill(slot, token_ids, start)

    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor:
        time.sleep(self.seconds)
        return super().decode(slots, token_ids, positions)


class BeforeStream(TokenStream):
    """The stream before this change: every token its own ``call_soon_threadsafe``."""

    def __call__(self, token: int | None, finish_reason: str | None) -> None:
        try:
            self.outbox.loop.call_soon_threadsafe(self.queue.put_nowait, (token, finish_reason))
        except RuntimeError:
            pass


class BeforeDetokenizer:
    """The detokenizer before this change: the whole text decoded again every token."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.tokens, self.sent = tokenizer, [], ""

    def add(self, token: int | None, last: bool) -> str | None:
        if token is not None:
            self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith(REPLACEMENT) and not last:
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece


@contextmanager
def version(before: bool):
    """The serving path before this change (the baselines above patched in), or as it is."""
    if not before:
        yield
        return
    with mock.patch.object(api, "TokenStream", BeforeStream), mock.patch.object(api, "Detokenizer", BeforeDetokenizer):
        yield


def word_tokenizer():
    """Words w0 ... w254 and [UNK], one token each: text without a download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")


def served(tokens: int):
    from kernelfleet.serve.model import Served

    return Served("free", None, word_tokenizer(), frozenset(), VOCAB, tokens + 8)


def engine_of(tokens: int, step_seconds: float = 0.0):
    from kernelfleet.serve.engine import Engine

    return Engine(WaitingStep(1, tokens + 8, step_seconds) if step_seconds else FreeStep(1, tokens + 8), 1)


def greedy(engine, tokens: int, sink):
    from kernelfleet.serve.sampling import Sampling

    return engine.submit([1, 2], tokens, frozenset(), Sampling(temperature=0.0), sink)


def stepped(tokens: int, step_seconds: float = 0.0) -> float:
    """Row 1 (and 6): seconds per token of the engine alone."""
    engine, stamps = engine_of(tokens, step_seconds), []
    greedy(engine, tokens, lambda token, reason: stamps.append(time.perf_counter()))
    while engine.step():
        pass
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def on_loop(tokens: int, chunks: bool) -> float:
    """Rows 2 and 3: the engine's thread into an event loop here, and (``chunks``) each token's event."""
    async def consume() -> float:
        engine = engine_of(tokens).start()
        stream = api.TokenStream(Outbox(asyncio.get_running_loop()))
        request, stamps = greedy(engine, tokens, stream), []
        try:
            if chunks:
                head = {"id": "cmpl-bench", "created": 0, "model": "free"}
                async for event in api.sse_events(engine, [api.Chosen(request, stream, None)], served(tokens), head):
                    if event.startswith("data: {"):
                        stamps.append(time.perf_counter())
            else:
                async for _ in stream:
                    stamps.append(time.perf_counter())
        finally:
            engine.close()
        return (stamps[-1] - stamps[0]) / (len(stamps) - 1)

    return asyncio.run(consume())


# The clients, each in its own process (the server's threads do not share a GIL with it): seconds per token
RAW_CLIENT = """
import json, socket, sys, time
port, body = int(sys.argv[1]), sys.argv[2].encode()
sock = socket.create_connection(("127.0.0.1", port))
sock.sendall(b"POST /v1/completions HTTP/1.1\\r\\nhost: bench\\r\\ncontent-type: application/json\\r\\n"
             b"content-length: %d\\r\\n\\r\\n" % len(body) + body)
seen, first, tail = 0, None, b""
while b"data: [DONE]" not in tail:
    data = sock.recv(1 << 16)
    if not data:
        break
    seen += data.count(b"data: {")
    if first is None and seen:
        first, at_first = time.perf_counter(), seen
    tail = (tail + data)[-64:]
print((time.perf_counter() - first) / (seen - at_first))
"""
HTTPX_CLIENT = """
import json, sys, time, httpx
port, body = int(sys.argv[1]), json.loads(sys.argv[2])
stamps = []
with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600) as answer:
    for line in answer.iter_lines():
        if line.startswith("data: {"):
            json.loads(line[6:])
            stamps.append(time.perf_counter())
print((stamps[-1] - stamps[0]) / (len(stamps) - 1))
"""


def over_http(tokens: int, client: str, step_seconds: float = 0.0) -> float:
    """Rows 4, 5 and 7: the app on uvicorn in this process, ``client`` in its own."""
    from kernelfleet.fleet.listener import Listener, bind

    engine = engine_of(tokens, step_seconds).start()
    sock = bind("127.0.0.1", 0)
    server = Listener(api.serve_app(engine, served(tokens)), sock).start()
    body = json.dumps({"prompt": [1, 2], "max_tokens": tokens, "temperature": 0, "stream": True})
    try:
        done = subprocess.run([sys.executable, "-c", client, str(sock.getsockname()[1]), body], capture_output=True,
                              text=True, timeout=600, check=False)
    finally:
        server.stop()
        engine.close()
    if done.returncode != 0:
        raise SystemExit(f"bench.serve_cpu --parts: the client failed: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout)


ROWS: dict[str, Callable[[int], float]] = {
    "engine step, a sink that does nothing": stepped,
    "+ hand-off: engine thread -> asyncio loop": lambda n: on_loop(n, chunks=False),
    "+ the token's event: text, pydantic JSON": lambda n: on_loop(n, chunks=True),
    "+ HTTP: uvicorn, loopback, raw client": lambda n: over_http(n, RAW_CLIENT),
    "  with an httpx client parsing each chunk": lambda n: over_http(n, HTTPX_CLIENT),
    # a GPU-like step: what the serving path adds when the engine's thread waits most of the time
    f"engine, a {GPU_STEP_SECONDS * 1e3:g} ms step waiting as on a GPU": lambda n: stepped(
        min(n, GPU_STEP_TOKENS), GPU_STEP_SECONDS),
    "  the same over HTTP, raw client": lambda n: over_http(min(n, GPU_STEP_TOKENS), RAW_CLIENT, GPU_STEP_SECONDS),
}


def parts(tokens: int, repeats: int) -> None:
    print(f"command: {command_line()}")
    print(f"per streamed token at batch 1, a backend whose step is free (FreeStep), {tokens} tokens a run, "
          f"median of {repeats}; torch {torch.__version__}")
    runs = {(name, before): [] for name in ROWS for before in (True, False)}
    for repeat in range(repeats):
        for before in ((True, False) if repeat % 2 == 0 else (False, True)):
            with version(before):
                for name, row in ROWS.items():
                    runs[name, before].append(row(tokens))
    us = {key: statistics.median(values) * 1e6 for key, values in runs.items()}
    print(f"\n{'us per token':<44} {'before':>8} {'after':>8} {'saved':>8}")
    for name in ROWS:
        print(f"{name:<44} {us[name, True]:>8.1f} {us[name, False]:>8.1f} {us[name, True] - us[name, False]:>8.1f}")
    names = list(ROWS)
    client = {before: us[names[4], before] - us[names[3], before] for before in (True, False)}
    print(f"{'the httpx client share (row 5 - row 4)':<44} {client[True]:>8.1f} {client[False]:>8.1f}")
    added = {before: us[names[6], before] - us[names[5], before] for before in (True, False)}
    print(f"{'HTTP on a GPU-like step (row 7 - row 6)':<44} {added[True]:>8.1f} {added[False]:>8.1f}   "
          f"{100 * added[False] / us[names[5], False]:+.1f} % of the step after")
    print(json.dumps({"command": command_line(), "tokens": tokens, "repeats": repeats,
                      "us_per_token": {name: {"before": us[name, True], "after": us[name, False]} for name in ROWS},
                      "client_share_us_per_token": {"before": client[True], "after": client[False]},
                      "http_on_gpu_like_step_us_per_token": {"before": added[True], "after": added[False]}}))


def main() -> None:
    """The same as ``python -m bench.serve_cpu --parts`` (its flags), under this module's name."""
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part-tokens", type=int, default=2000, help="tokens a run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 tokens, one round (a check that it runs)")
    args = parser.parse_args()
    if args.part_tokens < 2 or args.repeats < 1:
        raise SystemExit("bench.serve_parts: --part-tokens must be at least 2 and --repeats at least 1")
    parts(*((200, 1) if args.quick else (args.part_tokens, args.repeats)))


if __name__ == "__main__":
    main()
