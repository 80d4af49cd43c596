"""``kernelfleet serve`` over HTTP: a real uvicorn on a free loopback port, real httpx clients.

Greedy completions of concurrent clients equal transformers' ``generate`` for a dense and an MoE
model; streaming gives the tokens a whole answer gives; bad input is a 400 with one line; a full
queue a 429; a client that goes away mid-stream, or while it waits for a whole answer, frees its
slot; many interleaved requests each get their own tokens, none lost."""

import asyncio
import contextlib
import threading
import time

import httpx
import pytest
from recorded import (
    PROMPTS,
    complete,
    interleaved,
    reference,
    served_model,
    serving,
    streamed,
    tiny_causal_lm,
)

from kernelfleet.fleet.listener import Listener, bind
from kernelfleet.serve.api import serve_app
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.engine import Engine

pytestmark = pytest.mark.unit
GREEDY = {"temperature": 0, "ignore_eos": True}


def streamed_tokens(chunks):
    return [t for c in chunks for t in c["choices"][0]["token_ids"]]


@pytest.fixture(scope="module")
def llama():
    return tiny_causal_lm("llama")


@pytest.mark.parametrize("kind", ["llama", "qwen2-moe"])
def test_concurrent_greedy_completions_equal_generate(kind):
    model = tiny_causal_lm(kind)
    lengths = [12, 5, 9, 16, 3, 7]

    async def clients(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(complete(client, prompt=p, max_tokens=n, **GREEDY)
                                          for p, n in zip(PROMPTS, lengths)))

    with serving(served_model(model, kind), slots=3) as (url, _):
        answers = asyncio.run(clients(url))
    for prompt, n, answer in zip(PROMPTS, lengths, answers):
        (choice,) = answer["choices"]
        assert choice["token_ids"] == reference(model, prompt, n, eos=False)
        assert choice["finish_reason"] == "length" and choice["text"] is None  # no tokenizer
        assert answer["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": n,
                                   "total_tokens": len(prompt) + n}
        assert answer["model"] == kind and answer["object"] == "text_completion"


def test_streaming_gives_the_tokens_of_the_whole_answer_greedy_and_seeded(llama):
    async def both(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            out = []
            for sampling in (GREEDY, {"temperature": 0.8, "top_p": 0.95, "seed": 5, "ignore_eos": True}):
                whole = await complete(client, prompt=PROMPTS[4], max_tokens=10, **sampling)
                again = await complete(client, prompt=PROMPTS[4], max_tokens=10, **sampling)
                chunks = await streamed(client, prompt=PROMPTS[4], max_tokens=10, **sampling)
                out.append((whole, again, chunks))
            return out

    with serving(served_model(llama)) as (url, _):
        for whole, again, chunks in asyncio.run(both(url)):
            tokens = whole["choices"][0]["token_ids"]
            assert again["choices"][0]["token_ids"] == tokens  # the same seed, the same tokens
            assert streamed_tokens(chunks) == tokens and len(chunks) == 10
            assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 9 + ["length"]
            assert len({c["id"] for c in chunks}) == 1


@pytest.mark.parametrize(("body", "status", "says"), [
    (b'{"prompt": [1, 2', 400, "not valid JSON"),
    ({"prompt": [1] * 130, "max_tokens": 1}, 400, "do not fit the context of 128 tokens"),
    ({"prompt": [1] * 100, "max_tokens": 29}, 400, "max_tokens 29 is past the cache"),
    ({"prompt": [1, 2], "logprobs": 2}, 400, "unknown field 'logprobs'"),
    ({"prompt": [1, 2], "temperature": -1}, 400, "temperature: Input should be greater than or equal to 0"),
    ({"prompt": [1, 256]}, 400, "token id 256 is outside the vocabulary (0 to 255)"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": "hello"}, 400, "has no tokenizer in its directory: send the prompt as token ids"),
    ({"prompt": [1], "model": "gpt-4"}, 404, "model 'gpt-4' is not served here; this server serves 'tiny'"),
])
def test_bad_input_is_one_line_in_openais_error_shape(llama, body, status, says):
    with serving(served_model(llama)) as (url, _engine):
        sent = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body}
        answer = httpx.post(f"{url}/v1/completions", timeout=30, **sent)
        fine = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert says in error["message"] and "\n" not in error["message"] and error["code"] == status
    assert fine.status_code == 200  # the server goes on


def test_a_full_queue_is_429_and_a_client_leaving_mid_stream_frees_its_slot(llama):
    async def scenario(url, engine):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions",
                                     json={"prompt": [3, 4], "max_tokens": 120, "stream": True, **GREEDY}) as long:
                lines = long.aiter_lines()
                assert (await anext(lines)).startswith("data: ")  # it holds the only slot now
                waiting = asyncio.create_task(complete(client, prompt=[5, 6], max_tokens=4, **GREEDY))
                while len(engine.scheduler.waiting) < 1:  # queued behind the stream
                    await asyncio.sleep(0.01)
                refused = await client.post("/v1/completions", json={"prompt": [7], "max_tokens": 2})
            # leaving the block closes the connection mid-stream
            done = await waiting
            metrics = (await client.get("/metrics")).text
            return refused, done, metrics

    with serving(served_model(llama), slots=1, max_queue=1) as (url, engine):
        refused, done, metrics = asyncio.run(scenario(url, engine))
    assert refused.status_code == 429 and "the queue is full" in refused.json()["error"]["message"]
    assert done["choices"][0]["token_ids"] == reference(llama, [5, 6], 4, eos=False)
    assert 'kernelfleet_serve_requests_total{finish_reason="cancelled"} 1.0' in metrics
    assert "kernelfleet_serve_rejected_requests_total 1.0" in metrics
    generated = next(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("kernelfleet_serve_generated_tokens_total"))
    assert generated < 120 + 4  # the stream stopped generating when its client left


def test_many_interleaved_requests_each_get_their_own_tokens_none_lost(llama):
    """The bounded load test: 48 clients, 16 at a time, half streaming, distinct prompts and lengths."""
    prompts = [[(7 * i + j) % 256 for j in range(1 + i % 9)] for i in range(48)]
    lengths = [2 + (5 * i) % 11 for i in range(48)]
    expected = [reference(llama, p, n, eos=False) for p, n in zip(prompts, lengths)]
    with serving(served_model(llama), slots=4, max_queue=16) as (url, engine):
        got = interleaved(url, prompts, lengths, 16)
        metrics = engine.metrics.exposition().decode()
    assert got == expected
    assert 'kernelfleet_serve_requests_total{finish_reason="length"} 48.0' in metrics
    assert "kernelfleet_serve_time_to_first_token_seconds_count 48.0" in metrics
    assert f"kernelfleet_serve_generated_tokens_total {float(sum(lengths))}" in metrics
    assert f"kernelfleet_serve_time_per_output_token_seconds_count {float(sum(lengths) - 48)}" in metrics
    assert "kernelfleet_serve_requests_running 0.0" in metrics and "kernelfleet_serve_requests_waiting 0.0" in metrics


def test_models_healthz_metrics_and_the_token(llama):
    with serving(served_model(llama), slots=2, token="s3cret") as (url, _):
        refused = httpx.get(f"{url}/v1/models")
        auth = {"authorization": "Bearer s3cret"}
        models = httpx.get(f"{url}/v1/models", headers=auth).json()
        health = httpx.get(f"{url}/healthz", headers=auth).json()
        done = httpx.post(f"{url}/v1/completions", headers=auth, json={"prompt": [1, 2, 3], "max_tokens": 3},
                          timeout=30)
        metrics = httpx.get(f"{url}/metrics", headers=auth).text
    assert refused.status_code == 401
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 128
    assert health == {"ok": True, "model": "tiny", "slots": 2, "running": 0, "waiting": 0}
    assert done.status_code == 200
    for name in ("time_to_first_token_seconds_bucket", "time_per_output_token_seconds_bucket",
                 "prompt_tokens_total 3.0", 'device_busy_seconds_total{device="cpu"}', "queue_limit_requests 64.0"):
        assert f"kernelfleet_serve_{name}" in metrics, name


class GatedBackend(EagerBackend):
    """The tiny model, each decode held until the test opens the gate: the request is certainly
    still generating when its client leaves."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.gate, self.waiting = threading.Event(), threading.Event()

    def decode(self, *args):
        self.waiting.set()
        self.gate.wait(60)
        return super().decode(*args)


def test_a_client_leaving_a_whole_answer_cancels_it_and_frees_its_slot(llama):
    backend = GatedBackend(llama, 1, 64)
    engine = Engine(backend, 4).start()
    sock = bind("127.0.0.1", 0)
    server = Listener(serve_app(engine, served_model(llama)), sock).start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def scenario():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            whole = asyncio.create_task(client.post("/v1/completions", json={"prompt": [3, 4], "max_tokens": 50,
                                                                            **GREEDY}))
            while not backend.waiting.is_set():  # prefilled, its first decode held
                await asyncio.sleep(0.01)
            whole.cancel()  # the client gives up: httpx closes its connection
            with contextlib.suppress(asyncio.CancelledError):
                await whole
        deadline = time.monotonic() + 30  # a bound for a server that never notices, not a speed check
        while not all(r.cancelled for r in engine.scheduler.running.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    try:
        asyncio.run(scenario())
        backend.gate.set()
        while engine.scheduler.running:
            time.sleep(0.01)
        metrics = httpx.get(f"{url}/metrics").text
        health = httpx.get(f"{url}/healthz").json()
    finally:
        backend.gate.set()
        server.stop()
        engine.close()
    assert 'kernelfleet_serve_requests_total{finish_reason="cancelled"} 1.0' in metrics
    assert health["running"] == 0
    generated = next(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("kernelfleet_serve_generated_tokens_total"))
    assert generated <= 2  # the prefill's token and the decode under way, not 50
