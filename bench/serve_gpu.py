"""Benchmark: ``kernelfleet serve`` on one GPU — the server's own cost at batch 1 against the bare
graph loop, then Poisson arrivals and a trace of requests against the real HTTP server.

    python -m bench.serve_gpu --out DIR [--quick] [--cpu] [--trace FILE] \
        [--cases llama8b,moe,capped,replicas,split,pipeline,moe-strategies,plans,capped-plans] \
        [--prefill-chunk N[,N...]] \
        [--prefill-batch N[,N...]] [--plans-dir DIR] [--plans-model llama8b|moe] [--plan-slots S] [--plan-in-flight K] \
        [--capped-plan-slots S] [--second-gpu N]

Cases (each a config-only model directory, so the server draws seeded random bf16 weights on the
GPU; ``kernelfleet serve`` runs in its own process, as a user starts it):

* ``llama8b``: Llama 3 8B's shapes, 2048 tokens per slot, slots sized from the free memory;
* ``moe``: Qwen1.5-MoE-A2.7B's shapes at 12 of its 24 layers (60 experts, 4 a token, a shared one);
* ``capped``: the memory-capped pair, two devices of 20 GB (both on GPU 0), served three ways
  (cases ``capped-replicas``, ``capped-pipeline`` and ``capped-split``): request distribution, where
  each replica holds the 16 GB of weights and sizes its slots from the little that is left, the layer
  pipeline, where each device holds half the weights, so its KV cache, and the slots, are several
  times larger, and the prefill/decode split, whose decode device holds every weight and its cache
  in 20 GB. Their comparison, the tokens/s of each at its best load whose p99 time per output
  token is within 50 ms, and the pipeline over replicas (the issue's target: >= 2x), closes the run. These take
  at least 48 requests a rate even with ``--quick`` (fewer would not fill the replicas' slots), at
  16 and 64 requests/s: the second H200 run's 4/s (12 s of arrivals each) never gave either its
  best held tokens/s, and without it a sweep of three ``--prefill-chunk`` values fits 6 minutes;
* ``moe-strategies`` (not in the default ``--cases``): ``moe-replicas``, ``moe-split`` and
  ``moe-pipeline``, the three below with the MoE;
* ``replicas``, ``split`` and ``pipeline`` (not in the default ``--cases``): the 8B under
  ``--strategy replicas`` (two 60 GB devices), ``--strategy split`` (prefill in 30 GB, decode in
  100 GB) and ``--strategy pipeline`` (two 60 GB stages), both devices on GPU 0: the strategies'
  control flow and hand-over on one GPU, whose two devices share its SMs (no speed-up to expect;
  ``@1`` in their flags puts the second on another GPU). Their caps are an H200's: on a smaller card
  (an H100's 85 GB) those on GPU 0 shrink in proportion to 94 % of it (``on_card``; the flags printed
  and kept in the JSON are the ones that ran);
* ``plans`` (not in the default ``--cases``): kernelfleet's own plans for the 8B (``--plans-model
  moe``: the MoE's shapes above) on two partitions of GPU 0 (``serve --plans``, the monitor
  switching between the latency and the throughput plan),
  beside the same server over plans that keep everything on the home partition (``plans-a``) and
  the single-device server on the whole GPU (``plans-whole``), all with the same slots; the plans
  are made first by ``kernelfleet profile`` and ``kernelfleet plan --state-home --in-flight 1`` per
  batch bucket (``bench/serve_plans.py``; ``--plan-in-flight`` sets the number in flight;
  ``--plans-dir`` keeps them for the next run). GPU only.
* ``capped-plans`` (not in the default ``--cases``): kernelfleet's plans on the memory-capped pair,
  32 slots (``--capped-plan-slots``; the pipeline's 64 fit the caps only with a's weights moved to
  b), on the pair's devices (the whole GPU each), each held to 20 GB in the plans and in the server
  (``bench/serve_plans.py``; in ``--plans-dir``'s ``capped`` folder, else
  ``DIR/plans-work-capped-SLOTS``), its row beside the capped pair's. GPU only.

``--second-gpu N`` puts every two-device case's second device on GPU N, and makes and serves the
plans on the whole of each GPU (a on 0, b on N): the serve benchmark with the devices on separate
GPUs (issue 20; ``bash bench/pending_run.sh capped-x2 strategies-x2``).

Tables, for each case:

1. (``llama8b`` only) batch 1, ms per output token, medians of interleaved runs: the bare loop (the
   graph backend's decode and an arg max, in this process), the engine stepped in this process (no
   HTTP), and the server streaming over loopback HTTP; each against the bare loop (target: ≤ 5 %).
   The bare loop and the engine run with the server's tokens per slot: a graph attends to its
   rows' whole context, masked, so a bare loop over a cache of only the request's tokens would
   count the server's longer context as its overhead (the first H200 run did). That short-cache
   loop is the table's last row: what the whole-context attention costs.
2. Poisson arrivals at each rate (``--requests`` each; prompts of 64-512 tokens, 64-128 out, greedy,
   end tokens ignored): tokens/s, p50/p99 time to first token, p50/p99 time per output token (per
   request: (last token - first token) / (tokens - 1)), and the highest rate whose p99 time per
   output token is at most 50 ms.
3. The trace (``--trace FILE``, CSV ``arrival_seconds,prompt_tokens,output_tokens``; without one a
   seeded bursty trace is written to DIR/trace.csv and replayed), the same figures.

``--prefill-chunk`` (the server's flag: prompt tokens prefilled a step at most, 0 whole prompts)
and ``--prefill-batch`` (whole prompts prefilled together in one forward at most) take comma
lists, default the server's (whole prompts, 8 a forward): every case runs once per pair of values
that combine (a chunk and a batch above 1 do not), each with its own server, and the capped pair
is compared per pair, then side by side (the setting to pick: the best ratio).

Every answer is checked to hold the tokens it asked for: a lost or short request fails the run.
``--cpu`` runs the same control flow on the CPU with tiny models (what CI runs, with ``--quick``).
The JSON of the whole run goes to DIR/serve_gpu.json and is the last line printed.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gc
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import torch
import transformers
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from bench import Parser, command_line
from bench.serve_cpu import gaps, percentile
from bench.serve_plans import CAP_GB, SLOTS, prepare, served_flags
from kernelfleet.plan.command import MAX_IN_FLIGHT
from kernelfleet.serve.plan_buckets import IN_FLIGHT, on_this_gpu, reserving
from kernelfleet.serve.scheduler import DEFAULT_PREFILL_BATCH, DEFAULT_PREFILL_CHUNK_TOKENS, checked_prefill

TPOT_SLO_SECONDS = 0.050
STARTUP_SECONDS = 900  # an 8B's random weights, the footprint and seven graph captures


@dataclass(frozen=True)
class Case:
    """One server to measure: its model config, tokens per slot, flags, and the load it gets."""

    name: str
    config: dict
    context_tokens: int
    flags: tuple[str, ...]
    rates_per_second: tuple[float, ...]
    overhead: bool = False
    least_requests: int = 0  # per rate, whatever --requests says


LLAMA8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "max_position_embeddings": 8192, "rope_theta": 500000.0}
MOE = {"model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
       "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
       "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
       "max_position_embeddings": 8192}
TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
TINY_MOE = {**TINY, "model_type": "qwen2_moe", "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
            "num_experts": 4, "num_experts_per_tok": 2}

CAPPED = ("capped-replicas", "capped-pipeline")  # --cases capped: the pair, both ways
PLANNED = ("plans-whole", "plans-a", "plans")  # --cases plans: made at run time, once the plans are (plans_cases)
# --cases capped-plans: kernelfleet's plans on the capped pair (bench/serve_plans.py), made at run time too. The
# cache stays on a (plan --state-home): 32 slots hold 8.6 GB there, so the MILP must move about a third of the
# weights to b; the pipeline's 64 slots (17.2 GB of cache, --capped-plan-slots 64) leave a under 3 GB for weights,
# so b holds nearly all of them and a the cache and attention
CAPPED_PLANS, CAPPED_PLAN_SLOTS = "capped-plans", 32
PLANS_MODELS = {"llama8b": LLAMA8B, "moe": MOE}  # --plans-model: what the plans cases are made and served for
GPU_CASES = [Case("llama8b", LLAMA8B, 2048, (), (4.0, 16.0, 64.0), overhead=True),
             Case("moe", MOE, 2048, (), (4.0, 16.0, 64.0)),
             Case("capped-replicas", LLAMA8B, 2048, ("--strategy", "replicas", "--device", "r0:20@0", "--device",
                                                     "r1:20@0"), (16.0, 64.0), least_requests=48),
             Case("capped-pipeline", LLAMA8B, 2048, ("--strategy", "pipeline", "--device", "p0:20@0", "--device",
                                                     "p1:20@0"), (16.0, 64.0), least_requests=48),
             Case("capped-split", LLAMA8B, 2048, ("--strategy", "split", "--device", "pre:20@0", "--device",
                                                  "dec:20@0"), (16.0, 64.0), least_requests=48),
             # the strategies on one H200, both devices GPU 0 (use @1 for a second GPU): the mechanism, not a speed-up
             Case("replicas", LLAMA8B, 2048, ("--strategy", "replicas", "--device", "r0:60@0", "--device", "r1:60@0"),
                  (4.0, 16.0, 64.0)),
             Case("split", LLAMA8B, 2048, ("--strategy", "split", "--device", "pre:30@0", "--device", "dec:100@0"),
                  (4.0, 16.0, 64.0)),
             Case("pipeline", LLAMA8B, 2048, ("--strategy", "pipeline", "--device", "p0:60@0", "--device", "p1:60@0"),
                  (4.0, 16.0, 64.0))]
# the CPU's dry run: the same cases, tiny; nothing enforces a CPU twin's cap, so the capped pair's
# replicas and the split get 2 slots and the pipeline 4 instead (the pipeline's caps are checked, and hold it)
CPU_CASES = [Case("llama8b", {**TINY, "model_type": "llama"}, 256, ("--cpu",), (4.0, 16.0), overhead=True),
             Case("moe", TINY_MOE, 256, ("--cpu",), (4.0, 16.0)),
             Case("capped-replicas", {**TINY, "model_type": "llama"}, 256, ("--cpu", "--strategy", "replicas",
                                                                             "--device", "r0:2", "--device", "r1:2",
                                                                             "--slots", "2"), (4.0,)),
             Case("capped-pipeline", {**TINY, "model_type": "llama"}, 256, ("--cpu", "--strategy", "pipeline",
                                                                             "--device", "p0:2", "--device", "p1:2",
                                                                             "--slots", "4"), (4.0,)),
             Case("capped-split", {**TINY, "model_type": "llama"}, 256, ("--cpu", "--strategy", "split", "--device",
                                                                          "pre:2", "--device", "dec:2", "--slots",
                                                                          "2"), (4.0,)),
             Case("replicas", {**TINY, "model_type": "llama"}, 256, ("--cpu", "--strategy", "replicas", "--device",
                                                                      "cpu0:1", "--device", "cpu1:1", "--slots", "4"),
                  (4.0,)),
             Case("split", {**TINY, "model_type": "llama"}, 256, ("--cpu", "--strategy", "split", "--device", "pre:1",
                                                                   "--device", "dec:1", "--slots", "4"), (4.0,)),
             Case("pipeline", {**TINY, "model_type": "llama"}, 256, ("--cpu", "--strategy", "pipeline", "--device",
                                                                      "p0:2", "--device", "p1:2", "--slots", "4"),
                  (4.0,))]
STRATEGIES = ("replicas", "split", "pipeline")


def on_moe(cases: list[Case], config: dict) -> list[Case]:
    """The strategies' cases again with the MoE (``moe-replicas``, ...): the same devices and flags."""
    return [replace(case, name=f"moe-{case.name}", config=config) for case in cases if case.name in STRATEGIES]


GPU_CASES += on_moe(GPU_CASES, MOE)
CPU_CASES += on_moe(CPU_CASES, TINY_MOE)
GROUPS = {"capped": (*CAPPED, "capped-split"), "plans": PLANNED,
          "moe-strategies": tuple(f"moe-{name}" for name in STRATEGIES)}


CARD_SHARE = 0.94  # of a GPU's memory its devices' caps may take together (on_card); the rest is the CUDA context's


def on_gpus(case: Case, second_gpu: int) -> Case:
    """``case`` with its second ``--device`` on GPU ``second_gpu`` (``--second-gpu``: a pair of two
    GPUs, issue 20); as it is for 0, or with fewer than two devices."""
    flags = list(case.flags)
    devices = [k for k in range(1, len(flags)) if flags[k - 1] == "--device"]
    if second_gpu and len(devices) > 1:
        flags[devices[1]] = f"{flags[devices[1]].removesuffix('@0')}@{second_gpu}"
    return replace(case, flags=tuple(flags))


def on_card(case: Case, total_bytes: int) -> Case:
    """``case`` with its caps on GPU 0 (``--device NAME:GB@0``, written for an H200) scaled down, in
    proportion, to fit ``CARD_SHARE`` of a GPU of ``total_bytes`` (an H100's 85 GB): unchanged where they
    fit. Caps are rounded down to half a GB."""
    flags, caps = list(case.flags), {}
    for k, flag in enumerate(flags):
        name, _, rest = flag.partition(":")
        if k and flags[k - 1] == "--device" and rest.endswith("@0"):
            caps[k] = (name, float(rest.removesuffix("@0")))
    room = CARD_SHARE * total_bytes / 1e9
    held = sum(gb for _, gb in caps.values())
    if held <= room:
        return case
    for k, (name, gb) in caps.items():
        flags[k] = f"{name}:{int(gb * room / held * 2) / 2:g}@0"
    return replace(case, flags=tuple(flags))


@dataclass(frozen=True)
class Shape:
    """How long prompts and outputs are: uniform in these bounds (inclusive)."""

    prompt: tuple[int, int]
    output: tuple[int, int]


GPU_SHAPE, CPU_SHAPE = Shape((64, 512), (64, 128)), Shape((4, 32), (4, 16))


class Load(BaseModel):
    """One load against the server and what the clients saw."""

    load: str
    requests: int
    output_tokens: int
    seconds: float
    tokens_per_second: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    plan_steps: dict[str, float] | None = None  # a server over plans: its decode steps under each plan in this load


class Overhead(BaseModel):
    """Batch 1: ms per output token of each way, and against the bare loop."""

    bare_ms_per_token: float
    bare_short_cache_ms_per_token: float
    engine_ms_per_token: float
    server_ms_per_token: float
    engine_vs_bare_percent: float
    server_vs_bare_percent: float


class CaseResult(BaseModel):
    name: str
    prefill_chunk_tokens: int  # the server's --prefill-chunk (0: whole prompts)
    prefill_batch: int = 1  # the server's --prefill-batch
    flags: list[str]
    slots: int
    context_tokens: int
    startup_seconds: float
    overhead: Overhead | None
    poisson: list[Load]
    trace: Load
    max_rate_at_p99_tpot_50ms: float | None


class CappedPair(BaseModel):
    """The memory-capped pair both ways, at one --prefill-chunk and --prefill-batch: each one's
    tokens/s at its best load held at p99 TPOT <= 50 ms."""

    prefill_chunk_tokens: int
    prefill_batch: int = 1
    replicas_slots: int
    pipeline_slots: int
    replicas_tokens_per_second: float | None
    pipeline_tokens_per_second: float | None
    pipeline_vs_replicas: float | None
    split_slots: int | None = None  # the prefill/decode split on the same pair, where it ran
    split_tokens_per_second: float | None = None
    plans_slots: int | None = None  # kernelfleet's plans on the same pair (capped-plans), where they ran
    plans_tokens_per_second: float | None = None


class PlansRow(BaseModel):
    """The plans cases at one prefill setting: each server's best tokens/s held at p99 TPOT <= 50 ms."""

    model: str = "llama8b"  # PLANS_MODELS' key the plans were made and served for
    prefill_chunk_tokens: int
    prefill_batch: int
    tokens_per_second: dict[str, float | None]  # by case name (PLANNED)
    plans_vs_home_alone: float | None
    plans_vs_whole_gpu: float | None


class Report(BaseModel):
    command: str
    device: str
    torch: str
    transformers: str = ""  # earlier reports did not say (docs/validation/serve-gpu.md does, run by run)
    cases: list[CaseResult]
    capped_pairs: list[CappedPair]  # one a prefill setting, when the pair ran
    plans: list[PlansRow] = []  # one a prefill setting, when the plans cases ran


@dataclass(frozen=True)
class Arrival:
    arrival_seconds: float
    prompt_tokens: int
    output_tokens: int


def poisson(rate: float, n: int, shape: Shape, seed: int) -> list[Arrival]:
    rng, now, out = random.Random(seed), 0.0, []
    for _ in range(n):
        now += rng.expovariate(rate)
        out.append(Arrival(now, rng.randint(*shape.prompt), rng.randint(*shape.output)))
    return out


def bursty_trace(n: int, shape: Shape, seed: int) -> list[Arrival]:
    """Bursts of 2-8 requests at once, a second or so apart: what a trace of real traffic looks like
    to a scheduler (arrivals that are not Poisson)."""
    rng, now, out = random.Random(seed), 0.0, []
    while len(out) < n:
        for _ in range(min(rng.randint(2, 8), n - len(out))):
            out.append(Arrival(now + rng.uniform(0, 0.05), rng.randint(*shape.prompt), rng.randint(*shape.output)))
        now += rng.uniform(0.5, 1.5)
    return sorted(out, key=lambda a: a.arrival_seconds)


def write_trace(path: Path, arrivals: list[Arrival]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["arrival_seconds", "prompt_tokens", "output_tokens"])
        writer.writerows([f"{a.arrival_seconds:.4f}", a.prompt_tokens, a.output_tokens] for a in arrivals)


def read_trace(path: Path) -> list[Arrival]:
    """A trace CSV (module docstring), or SystemExit with one line naming the file and the row."""
    try:
        with path.open(newline="") as file:
            rows = list(csv.DictReader(file))
    except OSError as exc:
        raise SystemExit(f"bench.serve_gpu: --trace {path}: {exc.strerror}") from exc
    arrivals = []
    for number, row in enumerate(rows, 2):
        try:
            arrival = Arrival(float(row["arrival_seconds"]), int(row["prompt_tokens"]), int(row["output_tokens"]))
        except (KeyError, TypeError, ValueError):
            raise SystemExit(f"bench.serve_gpu: --trace {path} line {number}: expected arrival_seconds,prompt_tokens,"
                             f"output_tokens (a number, two whole numbers), got {dict(row)}") from None
        if arrival.arrival_seconds < 0 or arrival.prompt_tokens < 1 or arrival.output_tokens < 1:
            raise SystemExit(f"bench.serve_gpu: --trace {path} line {number}: arrival must be >= 0 and lengths >= 1")
        arrivals.append(arrival)
    if not arrivals:
        raise SystemExit(f"bench.serve_gpu: --trace {path}: no requests in it")
    return sorted(arrivals, key=lambda a: a.arrival_seconds)


def prompt_of(i: int, length: int, vocab: int) -> list[int]:
    rng = random.Random(i)
    return [rng.randrange(vocab) for _ in range(length)]


async def one(client: httpx.AsyncClient, body: dict, at: float, start: float) -> tuple[float, list[float]]:
    """One streaming request sent at ``start + at``: (time to first token, the stamps of its tokens)."""
    await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
    sent, stamps = time.perf_counter(), []
    async with client.stream("POST", "/v1/completions", json=body) as answer:
        if answer.status_code != 200:
            raise SystemExit(f"bench.serve_gpu: the server answered {answer.status_code}: {await answer.aread()}")
        async for line in answer.aiter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    return stamps[0] - sent, stamps


async def offered(url: str, arrivals: list[Arrival], vocab: int, context: int, label: str) -> Load:
    """Send ``arrivals`` on their schedule, streamed; every answer checked for its tokens."""
    bodies = []
    for i, a in enumerate(arrivals):
        prompt = min(a.prompt_tokens, context - 2)
        bodies.append({"prompt": prompt_of(i, prompt, vocab), "max_tokens": min(a.output_tokens, context - prompt),
                       "temperature": 0, "ignore_eos": True, "stream": True})
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        done = await asyncio.gather(*(one(client, b, a.arrival_seconds, start) for b, a in zip(bodies, arrivals)))
    for body, (_, stamps) in zip(bodies, done):
        if len(stamps) != body["max_tokens"]:
            raise SystemExit(f"bench.serve_gpu: {label}: a request asked for {body['max_tokens']} tokens and got "
                             f"{len(stamps)}")
    first, last = min(s[0] - t for (t, s) in done), max(s[-1] for _, s in done)
    tpot = [(s[-1] - s[0]) / (len(s) - 1) for _, s in done if len(s) > 1]
    ttft = [t for t, _ in done]
    tokens = sum(len(s) for _, s in done)
    seconds = last - first
    return Load(load=label, requests=len(done), output_tokens=tokens, seconds=seconds,
                tokens_per_second=tokens / seconds, ttft_p50_ms=percentile(ttft, .5) * 1e3,
                ttft_p99_ms=percentile(ttft, .99) * 1e3, tpot_p50_ms=percentile(tpot or [0.0], .5) * 1e3,
                tpot_p99_ms=percentile(tpot or [0.0], .99) * 1e3)


def start_server(folder: Path, case: Case, log: Path) -> tuple[subprocess.Popen, str, int, float]:
    """``kernelfleet serve hf:FOLDER`` in its own process, once it answers: the process, its URL,
    its slots and how long it took to start."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url, started = f"http://127.0.0.1:{port}", time.perf_counter()
    with log.open("w") as sink:
        server = subprocess.Popen([sys.executable, "-m", "kernelfleet", "serve", f"hf:{folder}", *case.flags,
                                   "--listen", f"127.0.0.1:{port}", "--context", str(case.context_tokens),
                                   "--max-queue", "4096"], stderr=sink)
    while server.poll() is None and time.perf_counter() - started < STARTUP_SECONDS:
        try:
            health = httpx.get(f"{url}/healthz", timeout=1)
            if health.status_code == 200:
                return server, url, health.json()["slots"], time.perf_counter() - started
        except httpx.TransportError:
            time.sleep(0.5)
    server.kill()
    said = (log.read_text().strip().splitlines() or ["(nothing)"])[-1]
    raise SystemExit(f"bench.serve_gpu: {case.name}: the server did not start ({said}; {log} has its log)")


def stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()


def overhead(folder: Path, url: str, case: Case, tokens: int, repeats: int) -> Overhead:
    """Batch 1, ms per token: the bare graph loop and the engine in this process, the server over HTTP."""
    from kernelfleet.serve.backend import EagerBackend
    from kernelfleet.serve.engine import Engine
    from kernelfleet.serve.graphs import GraphBackend
    from kernelfleet.serve.model import load
    from kernelfleet.serve.sampling import Sampling

    on_cpu = "--cpu" in case.flags
    device = "cpu" if on_cpu else "cuda:0"
    served = load(f"hf:{folder}", device, 0, torch.float32 if on_cpu else torch.bfloat16)
    prompt = prompt_of(0, 32, served.vocab_size)
    # the server's tokens per slot (module docstring); the short cache holds only this request's
    backend, short = (GraphBackend(EagerBackend(served.model, 1, context), graphs=not on_cpu)
                      for context in (case.context_tokens, len(prompt) + tokens))

    def bare(backend: GraphBackend = backend) -> float:
        token, steps = int(backend.prefill(0, prompt).argmax()), []
        for position in range(len(prompt), len(prompt) + tokens - 1):
            started = time.perf_counter()
            token = int(backend.decode([0], [token], [position])[0].argmax())
            steps.append(time.perf_counter() - started)
        return statistics.median(steps)

    def engine() -> float:
        loop, stamps = Engine(backend, 1), []
        loop.submit(prompt, tokens, frozenset(), Sampling(temperature=0.0),
                    lambda token, finish: stamps.append(time.perf_counter()))
        while loop.step():
            pass
        return statistics.median(gaps(stamps))

    def server() -> float:
        body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}

        async def streamed() -> list[float]:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                return (await one(client, body, 0.0, time.perf_counter()))[1]

        return statistics.median(gaps(asyncio.run(streamed())))

    ways = {"bare": bare, "engine": engine, "server": server, "short": lambda: bare(short)}
    runs: dict[str, list[float]] = {name: [] for name in ways}
    for repeat in range(repeats + 1):  # the first round warms each way up and is not kept
        names = list(ways)
        for name in names[repeat % 4:] + names[:repeat % 4]:  # each goes first as often: no order effect
            seconds = ways[name]()
            if repeat:
                runs[name].append(seconds)
    ms = {name: statistics.median(values) * 1e3 for name, values in runs.items()}
    return Overhead(bare_ms_per_token=ms["bare"], bare_short_cache_ms_per_token=ms["short"],
                    engine_ms_per_token=ms["engine"], server_ms_per_token=ms["server"],
                    engine_vs_bare_percent=100 * (ms["engine"] / ms["bare"] - 1),
                    server_vs_bare_percent=100 * (ms["server"] / ms["bare"] - 1))


def plan_steps(url: str) -> dict[str, float] | None:
    """The server's decode steps so far under each plan (``kernelfleet_serve_plan_steps_total``); None
    for a server that runs no plans."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {sample.labels["policy"]: sample.value for family in text_string_to_metric_families(text)
             for sample in family.samples if sample.name == "kernelfleet_serve_plan_steps_total"}
    return found or None


def with_plan_steps(url: str, run: Callable[[], Load]) -> Load:
    """``run()``'s load with the steps the server ran under each plan during it (``plan_steps``)."""
    before = plan_steps(url)
    load = run()
    after = plan_steps(url)
    if before is None or after is None:
        return load
    return load.model_copy(update={"plan_steps": {policy: after[policy] - before.get(policy, 0.0) for policy in after}})


def run_case(case: Case, args: argparse.Namespace, trace: list[Arrival], shape: Shape, out: Path,
             setting: tuple[int, int]) -> CaseResult:
    """``case``'s server with ``--prefill-chunk`` and ``--prefill-batch`` of ``setting``, its tables
    printed (module docstring)."""
    chunk, batch = setting
    case = replace(case, flags=(*case.flags, "--prefill-chunk", str(chunk), "--prefill-batch", str(batch)))
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(config_json(case.config))
        server, url, slots, startup = start_server(Path(folder), case,
                                                   out / f"server-{case.name}-chunk{chunk}-batch{batch}.log")
        try:
            print(f"\n{case.name}: {slots} slots of {case.context_tokens} tokens, started in {startup:.1f} s "
                  f"({' '.join(case.flags) or 'no flags'})", flush=True)
            spent = overhead(Path(folder), url, case, args.tokens, args.repeats) if case.overhead else None
            gc.collect()  # this process's copy of the model goes before the load runs
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if spent is not None:
                print(f"batch 1, {case.context_tokens} tokens a slot, median of {args.repeats} runs    ms/token   vs "
                      "bare loop")
                for name, ms, pct in [("bare loop (graph decode + arg max)", spent.bare_ms_per_token, 0.0),
                                      ("engine, no HTTP", spent.engine_ms_per_token, spent.engine_vs_bare_percent),
                                      ("server, streamed over HTTP", spent.server_ms_per_token,
                                       spent.server_vs_bare_percent),
                                      ("bare loop, cache of the request only", spent.bare_short_cache_ms_per_token,
                                       100 * (spent.bare_short_cache_ms_per_token / spent.bare_ms_per_token - 1))]:
                    print(f"{name:<36} {ms:>8.3f}   {pct:+7.1f} %")
            vocab = case.config["vocab_size"]
            requests = max(args.requests, case.least_requests)
            loads = [with_plan_steps(url, lambda rate=rate: asyncio.run(offered(
                         url, poisson(rate, requests, shape, seed=int(rate * 10)), vocab, case.context_tokens,
                         f"poisson {rate:g}/s")))
                     for rate in case.rates_per_second]
            replayed = with_plan_steps(url, lambda: asyncio.run(offered(url, trace, vocab, case.context_tokens,
                                                                        "trace")))
        finally:
            stop(server)
    held = [rate for rate, load in zip(case.rates_per_second, loads) if load.tpot_p99_ms <= TPOT_SLO_SECONDS * 1e3]
    print(f"{'load':<16} {'requests':>8} {'tokens/s':>9} {'TTFT p50 ms':>11} {'p99':>8} {'TPOT p50 ms':>11} {'p99':>7}")
    for load in [*loads, replayed]:
        split = "" if load.plan_steps is None else "   steps " + ", ".join(
            f"{policy} {steps:g}" for policy, steps in sorted(load.plan_steps.items()))
        print(f"{load.load:<16} {load.requests:>8} {load.tokens_per_second:>9.1f} {load.ttft_p50_ms:>11.1f} "
              f"{load.ttft_p99_ms:>8.1f} {load.tpot_p50_ms:>11.2f} {load.tpot_p99_ms:>7.2f}{split}")
    best = max(held) if held else None
    print(f"highest rate held at p99 TPOT <= {TPOT_SLO_SECONDS * 1e3:.0f} ms: "
          f"{'none of those measured' if best is None else f'{best:g} requests/s'}")
    return CaseResult(name=case.name, prefill_chunk_tokens=chunk, prefill_batch=batch, flags=list(case.flags),
                      slots=slots, context_tokens=case.context_tokens,
                      startup_seconds=startup, overhead=spent, poisson=loads, trace=replayed,
                      max_rate_at_p99_tpot_50ms=best)


def held_tokens_per_second(case: CaseResult) -> float | None:
    """The case's best tokens/s among its loads whose p99 time per output token is within the SLO."""
    held = [load.tokens_per_second for load in [*case.poisson, case.trace] if load.tpot_p99_ms <= TPOT_SLO_SECONDS * 1e3]
    return max(held) if held else None


def capped_pairs(results: list[CaseResult], settings: list[tuple[int, int]]) -> list[CappedPair]:
    """The capped pair's two ways side by side at each prefill setting (chunk, batch), then every
    setting's ratio, printed, when both ran."""
    pairs = [pair for setting in settings
             if (pair := capped_pair([r for r in results if (r.prefill_chunk_tokens, r.prefill_batch) == setting],
                                     setting)) is not None]
    if len(pairs) > 1:
        print(f"\nthe memory-capped pair by --prefill-chunk (0: whole prompts) and --prefill-batch, best tokens/s "
              f"held at p99 TPOT <= {TPOT_SLO_SECONDS * 1e3:.0f} ms")
        print(f"{'chunk':>6} {'batch':>6} {'replicas':>9} {'pipeline':>9} {'ratio':>6}")
        for pair in pairs:
            cells = [f"{v:.1f}" if v is not None else "none" for v in (pair.replicas_tokens_per_second,
                                                                         pair.pipeline_tokens_per_second)]
            ratio = "n/a" if pair.pipeline_vs_replicas is None else f"{pair.pipeline_vs_replicas:.2f}x"
            print(f"{pair.prefill_chunk_tokens:>6} {pair.prefill_batch:>6} {cells[0]:>9} {cells[1]:>9} {ratio:>6}")
    return pairs


def capped_pair(results: list[CaseResult], setting: tuple[int, int]) -> CappedPair | None:
    """The two ways of the capped pair at one prefill setting side by side, printed, when both ran."""
    by_name = {result.name: result for result in results}
    if not all(name in by_name for name in CAPPED):
        return None
    replicas, pipeline = (by_name[name] for name in CAPPED)
    ours, theirs = held_tokens_per_second(pipeline), held_tokens_per_second(replicas)
    ratio = ours / theirs if ours and theirs else None
    print(f"\nthe memory-capped pair at --prefill-chunk {setting[0]} --prefill-batch {setting[1]} "
          f"({' '.join(pipeline.flags)} against "
          f"{' '.join(replicas.flags)}), best tokens/s "
          f"held at p99 TPOT <= {TPOT_SLO_SECONDS * 1e3:.0f} ms")
    others = {name: by_name[case] for name, case in (("split", "capped-split"), ("plans", CAPPED_PLANS))
              if case in by_name}
    held = {name: held_tokens_per_second(result) for name, result in others.items()}
    print(f"{'strategy':<10} {'slots':>6} {'tokens/s':>9}")
    for name, result, rate in [("replicas", replicas, theirs), ("pipeline", pipeline, ours),
                               *((name, result, held[name]) for name, result in others.items())]:
        print(f"{name:<10} {result.slots:>6} {'none held' if rate is None else f'{rate:.1f}':>9}")
    print(f"pipeline / replicas: {'n/a' if ratio is None else f'{ratio:.2f}x'} (target >= 2x)")
    return CappedPair(prefill_chunk_tokens=setting[0], prefill_batch=setting[1], replicas_slots=replicas.slots,
                      pipeline_slots=pipeline.slots, replicas_tokens_per_second=theirs,
                      pipeline_tokens_per_second=ours, pipeline_vs_replicas=ratio,
                      split_slots=others["split"].slots if "split" in others else None,
                      split_tokens_per_second=held.get("split"),
                      plans_slots=others["plans"].slots if "plans" in others else None,
                      plans_tokens_per_second=held.get("plans"))


def plans_cases(plans: Path, home_alone: Path, model: str = "llama8b", slots: int = SLOTS,
                second_gpu: int = 0) -> list[Case]:
    """The ``plans`` cases (module docstring) of ``model`` (``PLANS_MODELS``) at ``slots`` slots over
    the plan folders ``bench.serve_plans.prepare`` made (``second_gpu``: for two GPUs)."""
    rates, config = (4.0, 16.0, 64.0), PLANS_MODELS[model]
    return [Case("plans-whole", config, 2048, ("--slots", str(slots)), rates),
            Case("plans-a", config, 2048, tuple(served_flags(home_alone, slots, second_gpu=second_gpu)), rates),
            Case("plans", config, 2048, tuple(served_flags(plans, slots, second_gpu=second_gpu)), rates)]


def plans_model_dir(work: Path, model: str) -> Path:
    """``work/model``, the config-only directory the plans of ``work`` are made for, written for
    ``model``; SystemExit where ``work`` holds another model's (its kept plans are that model's)."""
    folder, wanted = work / "model", config_json(PLANS_MODELS[model])
    config = folder / "config.json"
    if config.is_file() and config.read_text() != wanted:
        raise SystemExit(f"bench.serve_gpu: {work} holds plans for another model than --plans-model {model} "
                         f"({config}); give another --plans-dir")
    folder.mkdir(parents=True, exist_ok=True)
    config.write_text(wanted)  # seeded weights, as each server draws
    return folder


def plans_rows(results: list[CaseResult], settings: list[tuple[int, int]],
               model: str = "llama8b") -> list[PlansRow]:
    """The plans cases (of ``model``) side by side at each prefill setting where all three ran, printed."""
    out = []
    for chunk, batch in settings:
        found = {r.name: r for r in results if (r.prefill_chunk_tokens, r.prefill_batch) == (chunk, batch)}
        if not all(name in found for name in PLANNED):
            continue
        held = {name: held_tokens_per_second(found[name]) for name in PLANNED}
        ratio = {other: held["plans"] / held[other] if held["plans"] and held[other] else None
                 for other in ("plans-a", "plans-whole")}
        print(f"\nkernelfleet's plans for {model} at --prefill-chunk {chunk} --prefill-batch {batch}, best tokens/s "
              f"held at p99 TPOT <= {TPOT_SLO_SECONDS * 1e3:.0f} ms ({found['plans'].slots} slots each)")
        for name in PLANNED:
            print(f"{name:<12} {'none held' if held[name] is None else f'{held[name]:.1f}':>9}")
        print("plans / home partition alone: " + ("n/a" if ratio["plans-a"] is None else f"{ratio['plans-a']:.2f}x")
              + "; plans / the whole GPU: " + ("n/a" if ratio["plans-whole"] is None else f"{ratio['plans-whole']:.2f}x")
              + " (two partitions of one GPU: not a speed-up to expect, DESIGN)")
        out.append(PlansRow(model=model, prefill_chunk_tokens=chunk, prefill_batch=batch, tokens_per_second=held,
                            plans_vs_home_alone=ratio["plans-a"], plans_vs_whole_gpu=ratio["plans-whole"]))
    return out


def comma_values(given: str, flag: str, least: int, what: str, program: str = "bench.serve_gpu") -> list[int]:
    """``flag``'s comma list of distinct whole numbers of at least ``least``, or SystemExit with one
    line that ``program`` begins."""
    try:
        values = [int(value) for value in given.split(",")]
    except ValueError:
        values = []
    if not values or any(value < least for value in values) or len(set(values)) != len(values):
        raise SystemExit(f"{program}: {flag} takes distinct whole numbers {what}, comma-separated, got {given!r}")
    return values


def prefill_settings(chunks: str, batches: str | None) -> list[tuple[int, int]]:
    """Every (--prefill-chunk, --prefill-batch) pair of the two lists that the server takes (a chunk
    and a batch above 1 do not combine; without a batch list, the server's default for each chunk),
    or SystemExit with one line."""
    chunk_values = comma_values(chunks, "--prefill-chunk", 0, "of tokens (0: whole prompts)")
    if batches is None:
        return [(chunk, checked_prefill(chunk, None)) for chunk in chunk_values]
    settings = [(chunk, batch) for chunk in chunk_values
                for batch in comma_values(batches, "--prefill-batch", 1, "of prompts (1 or more)")
                if not (chunk and batch > 1)]
    if not settings:
        raise SystemExit(f"bench.serve_gpu: --prefill-chunk {chunks} and --prefill-batch {batches} leave no setting "
                         "the server takes (a chunk goes with a batch of 1)")
    return settings


def config_json(config: dict) -> str:
    """A case's config (``model_type`` and fields) as the config.json of a model directory."""
    from transformers import AutoConfig

    fields = dict(config)
    return AutoConfig.for_model(fields.pop("model_type"), **fields).to_json_string()


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON, the trace and server logs")
    parser.add_argument("--quick", action="store_true", help="few requests and tokens: a check that it runs")
    parser.add_argument("--cpu", action="store_true", help="tiny models on the CPU: the control flow only")
    parser.add_argument("--trace", type=Path, help="CSV arrival_seconds,prompt_tokens,output_tokens to replay")
    parser.add_argument("--cases", default="llama8b,moe,capped",
                        help="comma-separated, of llama8b, moe, capped (capped-replicas, capped-pipeline and "
                        "capped-split), "
                        "replicas, split, pipeline, moe-strategies (moe-replicas, moe-split and moe-pipeline), "
                        "plans (plans-whole, plans-a and plans; GPU only), capped-plans (GPU only)")
    parser.add_argument("--plans-dir", type=Path, help="where the plans cases' profiles and plans are made, and kept "
                        "for the next run (default DIR/plans-work-MODEL-SLOTS)")
    parser.add_argument("--requests", type=int, help="requests per Poisson rate (default 32; --quick 6)")
    parser.add_argument("--prefill-chunk", default=str(DEFAULT_PREFILL_CHUNK_TOKENS),
                        help="the server's --prefill-chunk, or a comma list: every case once per value "
                        f"(default {DEFAULT_PREFILL_CHUNK_TOKENS}; 0: whole prompts)")
    parser.add_argument("--prefill-batch",
                        help="the server's --prefill-batch, or a comma list, swept with --prefill-chunk's "
                        f"(default the server's: {DEFAULT_PREFILL_BATCH} for whole prompts, 1 with chunks)")
    parser.add_argument("--plans-model", choices=sorted(PLANS_MODELS), default="llama8b",
                        help="the model of the plans cases (default llama8b; moe: the moe case's shapes)")
    parser.add_argument("--plan-slots", type=int, default=SLOTS, help=f"the plans cases' slots (default {SLOTS}; "
                        "plans for one request in flight are profiled with the step once a profile where twice does "
                        "not fit the GPU)")
    parser.add_argument("--capped-plan-slots", type=int, default=CAPPED_PLAN_SLOTS, help="the capped-plans case's "
                        f"slots (default {CAPPED_PLAN_SLOTS}; 64: the pipeline's)")
    parser.add_argument("--second-gpu", type=int, default=0, help="put each case's second device on this GPU "
                        "(issue 20: the pair on two GPUs; the plans on the whole of each; default 0: one GPU)")
    parser.add_argument("--plan-trials", type=int, default=3, help="kernelfleet profile's --trials for the plans "
                        "cases (default 3)")
    parser.add_argument("--plan-seconds", type=float, default=60.0, help="kernelfleet plan's --time-limit (the MILP) "
                        "for each bucket of the plans cases (default 60)")
    parser.add_argument("--plan-in-flight", type=int, default=IN_FLIGHT, help="kernelfleet plan's --in-flight for "
                        f"the plans cases (default {IN_FLIGHT}: the server runs one batch a step; 0 leaves it out)")
    args = parser.parse_args()
    settings = prefill_settings(args.prefill_chunk, args.prefill_batch)
    args.requests = args.requests or (6 if args.quick else 32)
    args.tokens, args.repeats = (16, 1) if args.quick else (64, 3)
    cases = {case.name: case for case in (CPU_CASES if args.cpu else GPU_CASES)}
    chosen = [name for given in args.cases.split(",") for name in GROUPS.get(given, [given])]
    planned = any(name in PLANNED for name in chosen)
    capped_planned = CAPPED_PLANS in chosen
    if (args.plan_trials < 1 or not 0 < args.plan_seconds < 3600 or not 0 <= args.plan_in_flight <= MAX_IN_FLIGHT
            or not 1 <= args.plan_slots <= 64 or not 1 <= args.capped_plan_slots <= 64):
        raise SystemExit(f"bench.serve_gpu: --plan-trials must be at least 1, --plan-seconds within (0, 3600), "
                         f"--plan-in-flight within 0 to {MAX_IN_FLIGHT} and --plan-slots and --capped-plan-slots "
                         f"within 1 to 64, got {args.plan_trials}, {args.plan_seconds:g}, {args.plan_in_flight}, "
                         f"{args.plan_slots} and {args.capped_plan_slots}")
    if (planned or capped_planned) and args.cpu:
        raise SystemExit("bench.serve_gpu: the plans cases need a GPU (kernelfleet profile and serve --plans capture "
                         "CUDA graphs); --cpu runs the other cases")
    unknown = [name for name in chosen if name not in cases and name not in (*PLANNED, CAPPED_PLANS)]
    if unknown or args.requests < 1:
        raise SystemExit(f"bench.serve_gpu: --cases takes {', '.join([*cases, 'plans', CAPPED_PLANS])} and "
                         f"--requests at least 1; got {args.cases!r} and {args.requests}")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit(f"bench.serve_gpu: torch {torch.__version__} sees no CUDA device; --cpu runs the dry run")
    if args.second_gpu < 0 or args.second_gpu and (args.cpu or args.second_gpu >= torch.cuda.device_count()):
        raise SystemExit(f"bench.serve_gpu: --second-gpu {args.second_gpu}: not a GPU this machine has "
                         f"({0 if args.cpu else torch.cuda.device_count()} GPUs)")
    args.out.mkdir(parents=True, exist_ok=True)
    shape = CPU_SHAPE if args.cpu else GPU_SHAPE
    trace = read_trace(args.trace) if args.trace else bursty_trace(args.requests * 2, shape, seed=7)
    if not args.trace:
        write_trace(args.out / "trace.csv", trace)
    device = "the CPU" if args.cpu else torch.cuda.get_device_name(0)
    if not args.cpu:  # the strategies' caps are an H200's
        cases = {name: on_card(on_gpus(case, args.second_gpu), torch.cuda.get_device_properties(0).total_memory)
                 for name, case in cases.items()}
    print(f"command: {command_line()}")
    print(f"{device}, torch {torch.__version__}, transformers {transformers.__version__}; {args.requests} requests "
          f"per rate, trace of {len(trace)} "
          f"({args.trace or args.out / 'trace.csv'})")
    if planned:
        work = args.plans_dir or args.out / f"plans-work-{args.plans_model}-{args.plan_slots}"
        model = plans_model_dir(work, args.plans_model)
        print(f"\nthe plans for {args.plans_model}, per batch bucket, in {work} (kernelfleet profile, then plan "
              f"--state-home{f' --in-flight {args.plan_in_flight}' if args.plan_in_flight else ''}):", flush=True)
        made = prepare(model, work, 2048, args.plan_trials, milp_seconds=args.plan_seconds,
                       in_flight=args.plan_in_flight or None, slots=args.plan_slots,
                       room=lambda spec: on_this_gpu(spec, print), second_gpu=args.second_gpu)
        cases.update((case.name, case) for case in plans_cases(*made, args.plans_model, args.plan_slots,
                                                                args.second_gpu))
    if capped_planned:
        slots = args.capped_plan_slots
        work = args.plans_dir / "capped" if args.plans_dir else args.out / f"plans-work-capped-{slots}"
        print(f"\nthe plans for the memory-capped pair ({CAP_GB} GB a partition, one share of the weights, "
              f"{slots} slots), per batch bucket, in {work}:", flush=True)
        plans, _ = prepare(plans_model_dir(work, "llama8b"), work, 2048, args.plan_trials,
                           milp_seconds=args.plan_seconds, in_flight=args.plan_in_flight or None,
                           slots=slots, room=lambda spec: on_this_gpu(reserving(spec), print), capped=True,
                           second_gpu=args.second_gpu)
        flags = served_flags(plans, slots, True, args.second_gpu)
        cases[CAPPED_PLANS] = Case(CAPPED_PLANS, LLAMA8B, 2048, tuple(flags), (16.0, 64.0), least_requests=48)
    results = [run_case(cases[name], args, trace, shape, args.out, setting) for setting in settings for name in chosen]
    report = Report(command=command_line(), device=device, torch=torch.__version__,
                    transformers=transformers.__version__, cases=results,
                    capped_pairs=capped_pairs(results, settings), plans=plans_rows(results, settings, args.plans_model))
    (args.out / "serve_gpu.json").write_text(report.model_dump_json(indent=1))
    print(report.model_dump_json())


if __name__ == "__main__":
    main()
