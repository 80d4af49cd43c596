"""Helpers for tests that replay recordings (importable: tests/ is on the path, see conftest.py)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Self


def at_end_of(*recordings: Path):
    """An agent's clock for replayed recordings: the end of their last window, standing still (time is
    passed in, STYLE rule 3). The agent refuses windows far from its clock, so a recording from the
    past is replayed at the time it was made."""
    from kernelfleet.telemetry.replay import ReplaySource

    end = max(s.timestamp_seconds for path in recordings for batch in ReplaySource(path).batches() for s in batch)
    return lambda: end


def twin_replicas(folder: Path, step: str, devices: tuple[str, ...], slot: int = 0) -> dict:
    """A runtime replica per device of ``step`` as two H200s captured it (``folder/STEP.DEVICE.capture.json.gz``),
    its nodes named (device, slot, index) and its context ``DEVICE-SLOT``: what the executor builds
    from on the null driver."""
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.cuda.capture import Captured
    from kernelfleet.kernels.raw import RawCapture
    from kernelfleet.runtime.executor import Replica

    out = {}
    for device in devices:
        raw = RawCapture.load(folder / f"{step}.{device}.capture.json.gz")
        nodes = [(device, slot, i) for i in range(len(raw.nodes))]
        captured = Captured(raw, None, None, nodes, (), None, context=f"{device}-{slot}")
        out[device] = Replica(captured, assemble(raw))
    return out


def misplaced_copies(views: dict, home: str, other: str, assignment: list[str]) -> tuple[int, list]:
    """Copies of a unit plan (``graph/units.py`` views by device, outputs at ``home``) to or from
    ``other`` whose bytes, translated into its capture, fall outside what their unit touches there
    (the reader's reads for a copy to it, the writer's writes for one from it), with the number of
    copies checked."""
    from kernelfleet.plan.transfers import UnitAddressMap, transfers

    mine, theirs = views[home], views[other]
    translate = UnitAddressMap(mine, theirs)
    buffers = {b.id: b for b in mine.program.buffers}
    checked, wrong = 0, []
    for t in transfers(mine.program, assignment, home):
        b = buffers[t.buffer]
        if other not in (t.src, t.dst):
            continue
        if t.writer is None:
            translate.translate_input(b.name, t.offset_bytes)  # raises where the other capture lacks the input
            continue
        at = translate.translate([t.reader, t.writer] if t.dst == other else [t.writer, t.reader],
                                 b.address + t.offset_bytes, t.length_bytes)
        unit, mode = (t.reader, "read") if t.dst == other else (t.writer, "write")
        checked += 1
        if unit is not None and not touches(theirs.program, unit, at, t.length_bytes, mode):
            wrong.append(t)
    return checked, wrong


def touches(program, unit: int | None, address: int, length: int, mode: str) -> bool:
    """Whether launch (or unit) ``unit`` of ``program`` touches [address, address + length) so
    (``mode``: read or write), or for a step input (no unit) whether some buffer of ``program`` holds it."""
    buffers = {b.id: b for b in program.buffers}
    if unit is None:
        return any(b.address <= address and address + length <= b.address + b.size_bytes for b in buffers.values())
    return any(buffers[a.buffer].address + a.offset_bytes <= address and address + length <= buffers[a.buffer].address
               + a.end for a in program.launches[unit].accesses if a.mode == mode)


def kubelet_reply(doc: dict) -> bytes:
    """A pod-resources ``List`` reply (protobuf JSON form, tests/data/kubelet) as a kubelet sends it:
    encoded with the fuller v1 schema (CPU ids, memory, NUMA topology), which kernelfleet reads only
    part of, so its parser meets fields it does not declare."""
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

    F = descriptor_pb2.FieldDescriptorProto

    def msg(name: str, *fields: tuple[str, int, int, int, str | None]) -> descriptor_pb2.DescriptorProto:
        return descriptor_pb2.DescriptorProto(name=name, field=[
            F(name=n, number=num, label=F.LABEL_REPEATED if rep else F.LABEL_OPTIONAL, type=kind, type_name=t)
            for n, num, rep, kind, t in fields])

    S, I, U, M = F.TYPE_STRING, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_MESSAGE
    proto = descriptor_pb2.FileDescriptorProto(name="kubelet_podresources_v1.proto", package="v1", syntax="proto3",
                                               message_type=[
        msg("ListPodResourcesResponse", ("pod_resources", 1, 1, M, ".v1.PodResources")),
        msg("PodResources", ("name", 1, 0, S, None), ("namespace", 2, 0, S, None),
            ("containers", 3, 1, M, ".v1.ContainerResources")),
        msg("ContainerResources", ("name", 1, 0, S, None), ("devices", 2, 1, M, ".v1.ContainerDevices"),
            ("cpu_ids", 3, 1, I, None), ("memory", 4, 1, M, ".v1.ContainerMemory")),
        msg("ContainerDevices", ("resource_name", 1, 0, S, None), ("device_ids", 2, 1, S, None),
            ("topology", 3, 0, M, ".v1.TopologyInfo")),
        msg("ContainerMemory", ("memory_type", 1, 0, S, None), ("size", 2, 0, U, None),
            ("topology", 3, 0, M, ".v1.TopologyInfo")),
        msg("TopologyInfo", ("nodes", 1, 1, M, ".v1.NUMANode")),
        msg("NUMANode", ("ID", 1, 0, I, None)),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    reply = message_factory.GetMessages([proto], pool=pool)["v1.ListPodResourcesResponse"]()
    return json_format.ParseDict(doc, reply).SerializeToString()


def serve_pod_resources(socket_path: Path, answer):
    """A real gRPC server on a unix socket that answers ``v1.PodResourcesLister/List`` with
    ``answer(request_bytes, context)`` (bytes out, unparsed: a test can send anything). Stop it."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(answer, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),))
    if not server.add_insecure_port(f"unix://{socket_path}"):
        raise OSError(f"cannot serve on {socket_path}")
    server.start()
    return server

def side_by_side(recordings: list[Path], out: Path, windows: slice = slice(None)) -> Path:
    """A trace in which recording i is GPU i of one machine, window by window (as long as the shortest):
    what a multi-GPU node looks like, built from single-GPU recordings without changing a value but
    the GPU's index, its uuid (made distinct) and the window's time (the first recording's)."""
    import dataclasses

    from kernelfleet.telemetry.replay import ReplaySource, TraceWriter

    runs = [list(ReplaySource(path).batches())[windows] for path in recordings]
    with TraceWriter(out, note="side by side: " + ", ".join(p.name for p in recordings)) as writer:
        for batches in zip(*runs):
            stamp = batches[0][0].timestamp_seconds
            writer.write([dataclasses.replace(batch[0], gpu_index=i, uuid=f"{batch[0].uuid}-{i}", timestamp_seconds=stamp)
                          for i, batch in enumerate(batches)])
    return out


# Prompts of different lengths for the serving tests, as token ids of the tiny models
PROMPTS = [[5, 9, 100, 3], [7] * 11, [1, 2, 3, 4, 5, 6, 7], [200], [42, 17] * 9, [3, 1, 4, 1, 5, 9, 2, 6]]


def reference(model, prompt: list[int], max_tokens: int, eos: bool = True) -> list[int]:
    """What transformers generates for ``prompt`` alone, greedily (``eos``: stopping at the end token)."""
    import torch

    ids = torch.tensor([prompt])
    extra = {} if eos else {"eos_token_id": None}
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                         pad_token_id=0, **extra)
    return out[0, len(prompt):].tolist()


def tiny_causal_lm(kind: str = "llama", seed: int = 0, vocab_size: int = 256):
    """A transformers causal LM small enough for a test on two CPU cores, random weights from
    ``seed``: ``llama`` (dense) or ``qwen2-moe`` (4 experts, 2 a token, a shared expert)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2MoeConfig

    shape = {"vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
    if kind == "llama":
        config = LlamaConfig(**shape)
    elif kind == "qwen2-moe":
        config = Qwen2MoeConfig(**shape, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                num_experts=4, num_experts_per_tok=2)
    else:
        raise ValueError(f"no tiny model {kind!r}")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().requires_grad_(False)


def word_tokenizer(vocab_size: int = 256):
    """A tokenizer of the words w0 ... w254 (and [UNK]), one token each: text prompts without a download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size - 1)} | {"[UNK]": vocab_size - 1}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")


def served_model(model, name: str = "tiny", tokenizer=None):
    """``model`` as ``kernelfleet serve`` holds a loaded directory (kernelfleet.serve.model.Served)."""
    from kernelfleet.serve.model import Served

    eos = model.generation_config.eos_token_id
    return Served(name, model, tokenizer, frozenset([eos] if isinstance(eos, int) else eos or []),
                  model.config.vocab_size, model.config.max_position_embeddings)


@contextmanager
def serving(served, slots: int = 4, max_queue: int = 64, context_tokens: int = 128, token: str | None = None,
            **options):
    """The server of ``served`` on a free loopback port, run by uvicorn as ``kernelfleet serve``
    runs it: yields its base URL and its engine; stopped on the way out. ``options`` go to
    ``kernelfleet.serve.command.build`` (``graphs=True``: the graph backend)."""
    from kernelfleet.fleet.listener import Listener, bind
    from kernelfleet.serve.command import build

    engine, app = build(served, slots, max_queue, context_tokens, token, **options)
    sock = bind("127.0.0.1", 0)
    server = Listener(app, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine
    finally:
        server.stop()
        engine.close()


def stepped(plan, prompts: list[list[int]], lengths: list[int],
            **options) -> tuple[list[list[int]], list[list[int]], dict]:
    """Greedy requests through an engine over ``plan`` (a serve strategy; ``options`` go to the
    engine: ``prefill_chunk_tokens``, ``prefill_batch``), stepped here: each one's tokens, after each
    step the backend index of every running request, and the busy seconds per device."""
    from kernelfleet.serve.engine import Engine
    from kernelfleet.serve.sampling import Sampling

    engine = Engine(plan, max_queue=len(prompts), **options)
    got: list[list[int]] = [[] for _ in prompts]
    where = []
    for prompt, n, tokens in zip(prompts, lengths, got):
        engine.submit(prompt, n, frozenset(), Sampling(temperature=0.0),
                      lambda token, finish, tokens=tokens: tokens.append(token))
    while engine.step():
        where.append(sorted(plan.locate(slot)[0] for slot in engine.scheduler.running))
    busy = {s.labels["device"]: s.value for metric in engine.metrics.registry.collect()
            if metric.name == "kernelfleet_serve_device_busy_seconds" for s in metric.samples
            if s.name.endswith("_total")}
    return got, where, busy


def interleaved(url: str, prompts: list[list[int]], lengths: list[int], at_once: int) -> list[list[int]]:
    """The bounded load test's clients: every prompt greedy for its length, ``at_once`` at a time,
    every other one streamed (its events checked to end with ``data: [DONE]``); each one's token ids."""
    import asyncio
    import json

    import httpx

    async def load() -> list[list[int]]:
        gate = asyncio.Semaphore(at_once)
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async def one(i: int) -> list[int]:
                body = {"prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0, "ignore_eos": True}
                async with gate:
                    if not i % 2:
                        answer = await client.post("/v1/completions", json=body)
                        assert answer.status_code == 200, answer.text
                        return answer.json()["choices"][0]["token_ids"]
                    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as answer:
                        events = [line async for line in answer.aiter_lines() if line]
                    assert events[-1] == "data: [DONE]", events[-1]
                    return [t for event in events[:-1] for t in json.loads(event[6:])["choices"][0]["token_ids"]]
            return await asyncio.gather(*(one(i) for i in range(len(prompts))))

    return asyncio.run(load())


def bench_quick(name: str, timeout_seconds: float = 900, args: tuple[str, ...] = ()) -> tuple[str, dict]:
    """``python -m bench.NAME --quick [ARGS]`` from the repository root, as CI runs it: its table (with
    the command line) and the JSON of its last line. A failed run fails with the end of its stderr."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", f"bench.{name}", "--quick", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout_seconds, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    *table, last = done.stdout.strip().splitlines()
    return "\n".join(table), json.loads(last)


def bench_refused(name: str, out: Path, *flags: str) -> str:
    """``python -m bench.NAME --cpu FLAGS --out OUT`` from the repository root, which must exit 1 with
    no traceback: what it said."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", f"bench.{name}", "--cpu", *flags, "--out", str(out)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip()


def free_port() -> int:
    """A loopback port nothing listens on now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeCommand:
    """``kernelfleet serve ARGS --listen 127.0.0.1:PORT`` in its own process, as a user runs it:
    ``url`` once ``/healthz`` answers; on the way out it gets Ctrl-C, and ``returncode`` and ``err``
    (its stderr) are what it left. One that has not exited a minute after Ctrl-C gets SIGABRT, whose
    faulthandler dump of every thread's stack is in the AssertionError that follows."""

    def __init__(self, *args: str, startup_seconds: float = 300) -> None:
        self.args, self.startup_seconds = args, startup_seconds
        self.url, self.returncode, self.err = "", None, ""

    def __enter__(self) -> Self:
        import subprocess
        import sys
        import time

        import httpx

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "kernelfleet", "serve", *self.args,
                                         "--listen", f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + self.startup_seconds
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.stderr.read()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise AssertionError(f"kernelfleet serve did not answer in {self.startup_seconds} s: {self.err}")

    def __exit__(self, *exc) -> None:
        import signal
        import subprocess

        self.process.send_signal(signal.SIGINT)
        try:
            _, self.err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack, then it ends
            _, self.err = self.process.communicate(timeout=60)
            raise AssertionError(f"kernelfleet serve did not exit within 60 s of Ctrl-C; its stderr:\n"
                                 f"{self.err[-6000:]}") from None
        self.returncode = self.process.returncode


async def complete(client, **body):
    """A whole completion from ``client`` (an httpx.AsyncClient on a serve server), checked to be a 200."""
    answer = await client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def streamed(client, **body):
    """The chunks of a streamed completion, checked to be server-sent events ending with ``data: [DONE]``."""
    import json

    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        events = [line async for line in answer.aiter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


async def whole_and_streamed(url: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Every prompt greedy for ``max_tokens`` (end token ignored) from the server at ``url`` at once,
    whole and then streamed: the token ids of each answer, the whole ones first."""
    import asyncio

    import httpx

    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    async def whole(client, prompt):
        return (await complete(client, prompt=prompt, **body))["choices"][0]["token_ids"]

    async def stream(client, prompt):
        return [t for chunk in await streamed(client, prompt=prompt, **body) for t in chunk["choices"][0]["token_ids"]]

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(*(whole(client, p) for p in prompts), *(stream(client, p) for p in prompts))


def run_main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """``kernelfleet serve ARGS`` in this process, which must exit with one line, ``kernelfleet:
    error: ...`` and no traceback: its exit code and that line."""
    import sys

    import pytest

    from kernelfleet.cli import main

    monkeypatch.setattr(sys, "argv", ["kernelfleet", "serve", *map(str, args)])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and "Traceback" not in err, err
    return stop.value.code, lines[0]


def cpu_strategy(name: str, model, folder: str):
    """A serve strategy of ``model`` (saved in ``folder``) on the CPU, small slots: ``eager``,
    ``graphs`` (the graph backend's CPU twin), ``replicas`` (an eager and a twin), ``split`` or
    ``pipeline`` (two one-layer stages, two micro-batch groups)."""
    import torch

    from kernelfleet.serve.backend import EagerBackend
    from kernelfleet.serve.graphs import GraphBackend
    from kernelfleet.serve.parts import build_part
    from kernelfleet.serve.pipeline import PipelineBackend, Stage
    from kernelfleet.serve.strategies import pipeline, replicas, single, split

    if name == "eager":
        return single(EagerBackend(model, 3, 64))
    if name == "graphs":  # the graph backend's CPU twin: its row moves, padding and persistent inputs
        return single(GraphBackend(EagerBackend(model, 3, 64), graphs=False))
    if name == "replicas":  # a part-prefilled request on one, the other decoding
        return replicas([EagerBackend(model, 2, 64, "cpu0"),
                         GraphBackend(EagerBackend(model, 1, 64), graphs=False, device_name="cpu1")])
    if name == "split":  # 3 staging slots: up to 3 prompts a prefill forward, handed over one by one
        return split(EagerBackend(model, 3, 64, "cpu0"), GraphBackend(EagerBackend(model, 3, 64), graphs=False,
                                                                      device_name="cpu1"))
    stages = [Stage(build_part(f"hf:{folder}", layers, "cpu", 0, torch.float32), name)
              for layers, name in zip([range(1), range(1, 2)], ["cpu0", "cpu1"])]
    return pipeline([PipelineBackend(stages, 2, 64, graphs=True), PipelineBackend(stages, 1, 64, graphs=True)])


def assert_same_fit(committed, made) -> None:
    """Two edge fits (``plan.edges.EdgeFit``) are the same: terms and plans, each term's seconds to 1e-9
    of it, not to the last bit: least squares runs on OpenBLAS, whose kernels (and so the last bits)
    follow the CPU it runs on."""
    import pytest

    assert [t.name for t in committed.terms] == [t.name for t in made.terms] and committed.plans == made.plans
    assert [t.seconds for t in committed.terms] == pytest.approx([t.seconds for t in made.terms], rel=1e-9)
