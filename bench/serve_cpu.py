"""Benchmark: ``kernelfleet serve`` on the CPU — the server's own cost per output token at batch 1
against the bare loop (target: at most 5 % of the step time), and tokens/s at a few concurrencies.

    python -m bench.serve_cpu [--hidden 512] [--layers 8] [--vocab 8192] [--tokens 64] \
        [--concurrency 1,2,4,8] [--repeats 5]

A Llama of the given size with random weights (float32). Three ways to make the same greedy
tokens, at batch 1, interleaved ``--repeats`` times (the median is shown, so a neighbour's load on
a shared machine hits each alike, and each goes first as often):

* the bare loop: the backend's prefill and decode calls and an arg max, nothing else;
* the engine: the generation loop (scheduler, sampler, metrics) stepped in this thread, no HTTP;
* the server: ``kernelfleet serve hf:DIR --cpu`` in its own process (the model saved to a temporary
  directory, the same weights), ``POST /v1/completions`` with ``stream: true`` over loopback HTTP;
  time per output token as the client sees the chunks arrive. The server idles while the other two
  run, and they idle while it runs.

Then the server at each concurrency: that many streaming clients at once, each ``--tokens`` tokens,
``--slots`` = the largest concurrency; tokens/s of the whole, and each request's time to first
token and per output token, p50 and p99.

``--pipeline`` instead times the layer pipeline's loop on the CPU: the engine (no HTTP) at each
concurrency over one device (the baseline), and over two CPU stages (half the layers each, each
built with only its part) with one micro-batch group and with two; tokens/s of each, the
medians of ``--repeats`` interleaved runs, and each against one device. On a CPU the stages
cannot overlap, so this is what the micro-batches' split costs (smaller batches, twice the steps
of each stage), not what they gain on GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import torch

from bench import Parser, command_line
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.sampling import Sampling

PROMPT_TOKENS = 16


def model(hidden: int, layers: int, vocab: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                         num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                         max_position_embeddings=1024)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().requires_grad_(False)


def prompt(i: int, vocab: int) -> list[int]:
    return [(31 * i + 7 * j) % vocab for j in range(PROMPT_TOKENS)]


def bare_seconds_per_token(lm, tokens: int) -> float:
    """Median seconds of one decode step and its arg max, with nothing around them."""
    backend = EagerBackend(lm, 1, PROMPT_TOKENS + tokens)
    ids = prompt(0, lm.config.vocab_size)
    token = int(backend.prefill(0, ids).argmax())
    steps = []
    for position in range(len(ids), len(ids) + tokens - 1):
        started = time.perf_counter()
        token = int(backend.decode([0], [token], [position])[0].argmax())
        steps.append(time.perf_counter() - started)
    return statistics.median(steps)


def engine_seconds_per_token(lm, tokens: int) -> float:
    """Median seconds between tokens of one request through the engine, stepped here."""
    engine = Engine(EagerBackend(lm, 1, PROMPT_TOKENS + tokens), 1)
    stamps = []
    engine.submit(prompt(0, lm.config.vocab_size), tokens, frozenset(), Sampling(temperature=0.0),
                  lambda token, finish: stamps.append(time.perf_counter()))
    while engine.step():
        pass
    return statistics.median(gaps(stamps))


async def streamed(client: httpx.AsyncClient, i: int, vocab: int, tokens: int) -> tuple[float, list[float]]:
    """One streaming request: (time to first token, gaps between tokens), as the client sees them."""
    body = {"prompt": prompt(i, vocab), "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    started, stamps = time.perf_counter(), []
    async with client.stream("POST", "/v1/completions", json=body) as answer:
        async for line in answer.aiter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
                json.loads(line[6:])  # a client reads what it gets
    return stamps[0] - started, gaps(stamps)


async def clients(url: str, n: int, vocab: int, tokens: int) -> tuple[float, list[tuple[float, list[float]]]]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(streamed(client, i, vocab, tokens) for i in range(n)))
        return time.perf_counter() - started, done


def gaps(stamps: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(stamps)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--concurrency", default="1,2,4,8", help="clients at once, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", action="store_true", help="the serving path's own cost per token, part by part, "
                        "before and after (bench/serve_parts.py), instead of the model's tables")
    parser.add_argument("--part-tokens", type=int, default=2000, help="tokens a run of --parts")
    parser.add_argument("--quick", action="store_true", help="with --parts: 200 tokens, one round (a check that it runs)")
    parser.add_argument("--pipeline", action="store_true", help="the layer pipeline's engine over two CPU stages, "
                        "one and two micro-batches, against one device, instead of the server's tables")
    args = parser.parse_args()
    if args.parts:
        from bench.serve_parts import parts

        if args.part_tokens < 2 or args.repeats < 1:
            raise SystemExit("bench.serve_cpu: --part-tokens must be at least 2 and --repeats at least 1")
        parts(*((200, 1) if args.quick else (args.part_tokens, args.repeats)))
        return
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"command: {command_line()}")
    lm = model(args.hidden, args.layers, args.vocab)
    if args.pipeline:
        pipeline_table(lm, args, levels)
        return
    parameters = sum(p.numel() for p in lm.parameters())
    print(f"Llama, {parameters / 1e6:.1f} M parameters (hidden {args.hidden}, {args.layers} layers, vocabulary "
          f"{args.vocab}), float32, torch {torch.__version__}, {torch.get_num_threads()} threads; prompts of "
          f"{PROMPT_TOKENS} tokens, {args.tokens} out")
    with tempfile.TemporaryDirectory() as folder:
        lm.save_pretrained(folder)
        server, url = start_server(folder, max(levels), PROMPT_TOKENS + args.tokens)
        try:
            report(lm, url, args, levels)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)


def start_server(folder: str, slots: int, context: int) -> tuple[subprocess.Popen, str]:
    """``kernelfleet serve hf:FOLDER --cpu`` in its own process, as a user starts it, once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "kernelfleet", "serve", f"hf:{folder}", "--cpu", "--listen",
                               f"127.0.0.1:{port}", "--slots", str(slots), "--max-queue", str(4 * slots),
                               "--context", str(context)], stderr=subprocess.DEVNULL)
    while server.poll() is None:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.2)
    raise SystemExit(f"kernelfleet serve exited with {server.returncode} before it answered")


def engine_tokens_per_second(backend, n: int, vocab: int, tokens: int) -> float:
    """``n`` requests of ``tokens`` each through the engine over ``backend``, stepped here: tokens/s."""
    engine = Engine(backend, n)
    for i in range(n):
        engine.submit(prompt(i, vocab), tokens, frozenset(), Sampling(temperature=0.0), lambda token, finish: None)
    started = time.perf_counter()
    while engine.step():
        pass
    return n * tokens / (time.perf_counter() - started)


def pipeline_table(lm, args: argparse.Namespace, levels: list[int]) -> None:
    """``--pipeline`` (module docstring)."""
    from kernelfleet.serve.command import micro_batch_slots
    from kernelfleet.serve.parts import build_part
    from kernelfleet.serve.pipeline import PipelineBackend, Stage
    from kernelfleet.serve.strategies import pipeline

    context, half = PROMPT_TOKENS + args.tokens, args.layers // 2
    with tempfile.TemporaryDirectory() as folder:
        lm.save_pretrained(folder)
        stages = [Stage(build_part(f"hf:{folder}", layers, "cpu", 0, torch.float32), f"cpu{i}")
                  for i, layers in enumerate([range(half), range(half, args.layers)])]
    ways = {"one device": lambda n: EagerBackend(lm, n, context),
            "pipeline, 1 micro-batch": lambda n: pipeline([PipelineBackend(stages, n, context)]),
            "pipeline, 2 micro-batches": lambda n: pipeline([PipelineBackend(stages, k, context)
                                                             for k in micro_batch_slots(n, 2)])}
    print(f"\nthe engine, no HTTP: tokens/s, median of {args.repeats} interleaved runs (vs one device)")
    print(f"{'clients':>7} " + " ".join(f"{name:>28}" for name in ways))
    for n in levels:
        runs: dict[str, list[float]] = {name: [] for name in ways}
        for repeat in range(args.repeats):
            names = list(ways)
            for name in names[repeat % 3:] + names[:repeat % 3]:  # each goes first as often: no order effect
                runs[name].append(engine_tokens_per_second(ways[name](n), n, args.vocab, args.tokens))
        rates = {name: statistics.median(values) for name, values in runs.items()}
        base = rates["one device"]
        print(f"{n:>7} " + " ".join(f"{rate:>18.1f} ({rate / base:>5.2f}x)" for rate in rates.values()))


def report(lm, url: str, args: argparse.Namespace, levels: list[int]) -> None:
    """The two tables: batch 1 against the bare loop, then the server at each concurrency."""
    asyncio.run(clients(url, 1, args.vocab, 4))  # warm: the first forward allocates the cache
    ways = {"bare loop (backend + arg max)": lambda: bare_seconds_per_token(lm, args.tokens),
            "engine, no HTTP": lambda: engine_seconds_per_token(lm, args.tokens),
            "server, streamed over HTTP": lambda: statistics.median(
                asyncio.run(clients(url, 1, args.vocab, args.tokens))[1][0][1])}
    runs: dict[str, list[float]] = {name: [] for name in ways}
    for repeat in range(args.repeats):
        names = list(ways)
        for name in names[repeat % 3:] + names[:repeat % 3]:  # each goes first as often: no order effect
            runs[name].append(ways[name]())
    base = statistics.median(runs["bare loop (backend + arg max)"])
    print(f"\nbatch 1, median of {args.repeats} runs of each   ms/token   vs bare loop")
    for name, seconds_per_token in runs.items():
        seconds = statistics.median(seconds_per_token)
        print(f"{name:<42} {seconds * 1e3:>8.3f}   {100 * (seconds / base - 1):+7.1f} %")
    print(f"\n{'clients':>7} {'tokens/s':>9} {'vs bare b=1':>11} {'TTFT p50 ms':>11} {'p99':>7} "
          f"{'TPOT p50 ms':>11} {'p99':>7}")
    for n in levels:
        wall, done = asyncio.run(clients(url, n, args.vocab, args.tokens))
        first = [ttft for ttft, _ in done]
        gaps = [g for _, request in done for g in request]
        rate = n * args.tokens / wall
        print(f"{n:>7} {rate:>9.1f} {rate * base:>10.2f}x {percentile(first, .5) * 1e3:>11.1f} "
              f"{percentile(first, .99) * 1e3:>7.1f} {percentile(gaps, .5) * 1e3:>11.2f} "
              f"{percentile(gaps, .99) * 1e3:>7.2f}")


if __name__ == "__main__":
    main()
