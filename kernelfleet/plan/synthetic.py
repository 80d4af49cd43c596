"""Seeded synthetic placement problems, for tests and the solver benchmark (not measurements).

``layered``: a transformer-like decode step (per layer: norm, QKV GEMM, attention, output
GEMM, residual add, norm, gate/up GEMM, activation, down GEMM, residual add) with roofline
costs, cost = max(flops / peak, bytes / bandwidth) + 5 us launch overhead, on device
profiles named after catalog SKUs (dense bf16 peak and HBM bandwidth from their datasheets:
A100 SXM 312 TFLOP/s, 2.04 TB/s; L40S 362 TFLOP/s, 0.864 TB/s; H100 SXM 989 TFLOP/s,
3.35 TB/s; RTX Pro 6000 Blackwell ~500 TFLOP/s, 1.79 TB/s). GEMMs are faster on the
compute-rich L40S, attention on the bandwidth-rich A100: the complementary pair of the paper.
``random_dag``: random launches and RAW edges with random costs, for property tests.
"""

from __future__ import annotations

import random

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Access, Buffer, Launch, Program
from kernelfleet.plan.model import Device, Link, Problem

PROFILES = {  # name: (dense bf16 FLOP/s, HBM bytes/s)
    "l40s": (362e12, 0.864e12), "a100": (312e12, 2.04e12), "h100": (989e12, 3.35e12), "rtxpro6000": (500e12, 1.79e12),
}
ORDER = ("l40s", "a100", "rtxpro6000", "h100")
OVERHEAD_SECONDS = 5e-6


def _acc(buffer: int, mode: str, size: int) -> Access:
    return Access(buffer, 0, size, mode, "schema")


def layered(n_layers: int, n_devices: int = 2, *, tokens: int = 256, hidden: int = 4096, ffn: int = 14336,
            context: int = 2048, link_bytes_per_second: float = 100e9,
            memory_bytes: int | None = None) -> Problem:
    """A decode step of ``n_layers`` layers (10 launches each, plus embedding, final norm, head)
    on ``n_devices`` devices taken in turn from ORDER (l40s, a100, rtxpro6000, h100, l40s-2, ...)."""
    if n_devices < 1:
        raise UsageError(f"need at least one device, got {n_devices}")
    names = [ORDER[i % len(ORDER)] + (f"-{i // len(ORDER) + 1}" if i >= len(ORDER) else "") for i in range(n_devices)]
    kind = {name: ORDER[i % len(ORDER)] for i, name in enumerate(names)}
    buffers: list[Buffer] = []
    launches: list[Launch] = []
    costs: list[dict[str, float | None]] = []

    def buf(size: int, role: str) -> int:
        buffers.append(Buffer(len(buffers), 0, 1 << 40 | len(buffers) << 32, size, role))
        return len(buffers) - 1

    def launch(name: str, reads: list[int], writes: list[int], flops: float) -> None:
        moved = sum(buffers[b].size_bytes for b in reads + writes)
        accesses = tuple(_acc(b, "read", buffers[b].size_bytes) for b in reads) + \
            tuple(_acc(b, "write", buffers[b].size_bytes) for b in writes)
        launches.append(Launch(len(launches), "kernel", name, accesses))
        costs.append({d: OVERHEAD_SECONDS + max(flops / PROFILES[kind[d]][0], moved / PROFILES[kind[d]][1])
                      for d in names})

    act = tokens * hidden * 2
    tokens_in = buf(tokens * 8, "input")
    h = buf(act, "activation")
    launch("embedding_gather", [tokens_in, buf(32000 * hidden * 2 // 64, "weight")], [h], 0.0)
    for _ in range(n_layers):
        n1, qkv, att, o, h2 = buf(act, "activation"), buf(act * 3 // 2, "activation"), buf(act, "activation"), \
            buf(act, "activation"), buf(act, "activation")
        kv = buf(tokens * context * 1024 * 2 * 2 // 16, "activation")  # GQA cache slice touched per step
        launch("rmsnorm", [h], [n1], 0.0)
        launch("nvjet_gemm_qkv", [n1, buf(hidden * hidden * 3 // 2 * 2, "weight")], [qkv], 2.0 * tokens * hidden * hidden * 1.5)
        launch("flash_attention_decode", [qkv, kv], [att], 4.0 * tokens * context * hidden / 8)
        launch("nvjet_gemm_o", [att, buf(hidden * hidden * 2, "weight")], [o], 2.0 * tokens * hidden * hidden)
        launch("elementwise_add", [h, o], [h2], 0.0)
        n2, gu, a, d, h3 = buf(act, "activation"), buf(tokens * ffn * 4, "activation"), \
            buf(tokens * ffn * 2, "activation"), buf(act, "activation"), buf(act, "activation")
        launch("rmsnorm", [h2], [n2], 0.0)
        launch("nvjet_gemm_gate_up", [n2, buf(hidden * ffn * 4, "weight")], [gu], 4.0 * tokens * hidden * ffn)
        launch("elementwise_silu_mul", [gu], [a], 0.0)
        launch("nvjet_gemm_down", [a, buf(hidden * ffn * 2, "weight")], [d], 2.0 * tokens * hidden * ffn)
        launch("elementwise_add", [h2, d], [h3], 0.0)
        h = h3
    n = buf(act, "activation")
    launch("rmsnorm", [h], [n], 0.0)
    launch("nvjet_gemm_lm_head", [n, buf(32000 * hidden * 2, "weight")], [buf(tokens * 32000 * 2, "output")],
           2.0 * tokens * hidden * 32000)
    devices = [Device(d, memory_bytes) for d in names]
    links = [Link(a, b, link_bytes_per_second) for i, a in enumerate(names) for b in names[i + 1:]]
    return Problem(Program(buffers, launches), devices, links, CostTable(costs, f"synthetic roofline, {n_layers} layers"))


def random_dag(n_launches: int, n_devices: int, seed: int, *, pins: int = 0, memory_bytes: int | None = None,
               bandwidths: list[float] | None = None) -> Problem:
    """Random launches, each writing one buffer and reading 1-3 earlier ones (mostly recent),
    with costs that favour a random device by up to 4x; ``pins`` launches are pinned."""
    rng = random.Random(seed)
    names = [f"gpu{i}" for i in range(n_devices)]
    buffers = [Buffer(0, 0, 1 << 40, 1 << 20, "input")]
    launches: list[Launch] = []
    costs: list[dict[str, float | None]] = []
    pinned = set(rng.sample(range(n_launches), pins))
    for k in range(n_launches):
        out = len(buffers)
        buffers.append(Buffer(out, 0, (1 << 40) + (out << 32), rng.choice([1, 2, 4, 8]) << 20, "activation"))
        earlier = list(range(out))
        reads = {rng.choice(earlier[-4:])} | {rng.choice(earlier) for _ in range(rng.randint(0, 2))}
        accesses = tuple(_acc(b, "read", buffers[b].size_bytes) for b in sorted(reads)) + \
            (_acc(out, "write", buffers[out].size_bytes),)
        launches.append(Launch(k, "kernel", f"k{k}", accesses, pinned="synthetic pin" if k in pinned else None))
        base = rng.uniform(20e-6, 200e-6)
        costs.append({d: base * rng.uniform(1.0, 4.0) for d in names})
    if bandwidths is None:
        bandwidths = [25e9] * (n_devices * (n_devices - 1) // 2)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    links = [Link(a, b, bw) for (a, b), bw in zip(pairs, bandwidths)]
    devices = [Device(d, memory_bytes) for d in names]
    return Problem(Program(buffers, launches), devices, links, CostTable(costs, f"synthetic random seed {seed}"))
