"""GEMM sweep: OFU against MFU over shapes and precisions, on a GPU.

    kernelfleet bench ofu --out DIR [--seconds 3.3] [--budget 330]

One `kernelfleet record` process samples the GPU for the whole sweep (1-s
windows, dense SM clock). This process runs every point — (M, N, K, precision)
— as CUDA-graph replays of back-to-back GEMMs for ``--seconds``, and writes one
line per point to DIR/sweep-points.jsonl.gz: the shape, precision, kernel names
from the profiler (their tile shapes give executed FLOPs), and the replay
timeline from CUDA events. Matching windows to points, MFU, raw and corrected
OFU are computed afterwards on the CPU from the two files. Stops starting new
points after ``--budget`` seconds so the device call ends in time.
"""

from __future__ import annotations

import gzip
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

SQUARE = (256, 512, 1024, 2048, 4096, 8192, 16384)
UNALIGNED = (200, 1000, 3000, 8200)
RECTANGULAR = ((8192, 8192, 1024), (16384, 2048, 8192), (4096, 14336, 4096), (2048, 8192, 28672))
RATE_GUESS = {"bf16": 6e14, "fp16": 6e14, "tf32": 3e14, "fp8": 1.1e15, "fp64": 5e13}  # FLOP/s, for sizing graphs


def operands(m: int, n: int, k: int, precision: str):
    """A callable that computes one C = A @ B of the precision, or None when unsupported."""
    dev = "cuda"
    if precision in ("bf16", "fp16", "fp64", "tf32"):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64, "tf32": torch.float32}[precision]
        a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
        c = torch.empty(m, n, device=dev, dtype=dtype)
        return lambda: torch.mm(a, b, out=c)
    if precision == "fp8":
        if k % 16 or n % 16:
            return None  # _scaled_mm needs K and N multiples of 16
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major B
        one = torch.ones((), device=dev)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    raise ValueError(precision)


def kernel_names(step) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


@dataclass
class GemmGraph:
    """One point's GEMM, captured ``per_graph`` times into one CUDA graph (about 2 ms a replay)."""

    graph: torch.cuda.CUDAGraph
    stream: torch.cuda.Stream
    kernels: list[str]
    per_graph: int
    flops: float  # of one GEMM


def gemm_graph(m: int, n: int, k: int, precision: str, between: Callable[[], object] | None = None) -> GemmGraph | None:
    """The point's GEMM warmed up, its kernel names and its graph; None where the precision has no GEMM here.
    ``between``: work without tensor-core math captured after every GEMM (a duty cycle below 1)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    step = operands(m, n, k, precision)
    if step is None:
        return None
    flops = 2.0 * m * n * k
    per_graph = min(1000, max(1, math.ceil(2e-3 * RATE_GUESS[precision] / flops)))  # ~2 ms a replay
    for _ in range(3):
        step()
    names = kernel_names(step)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # warm up on the capture stream
        if between is not None:
            between()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(per_graph):
            step()
            if between is not None:
                between()
    torch.cuda.synchronize()
    return GemmGraph(graph, stream, names, per_graph, flops)


def run_point(m: int, n: int, k: int, precision: str, seconds: float) -> dict | None:
    made = gemm_graph(m, n, k, precision)
    if made is None:
        return None
    graph, names, per_graph, flops = made.graph, made.kernels, made.per_graph, made.flops
    graph.replay()
    torch.cuda.synchronize()
    anchor = torch.cuda.Event(enable_timing=True)
    anchor.record()
    torch.cuda.synchronize()
    start_wall = time.time()
    events = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        graph.replay()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events.append(event)
        if len(events) % 32 == 0:
            events[-16].synchronize()
    torch.cuda.synchronize()
    ends = [start_wall + anchor.elapsed_time(e) / 1000.0 for e in events]
    del graph
    return {
        "m": m, "n": n, "k": k, "precision": precision, "kernels": names,
        "gemms_per_replay": per_graph, "work_per_iteration": flops * per_graph,
        "start_wall": start_wall, "ends_wall": ends,
        "mean_flops": flops * per_graph * len(ends) / (ends[-1] - start_wall),
    }


def points() -> list[tuple[int, int, int, str]]:
    """Every (M, N, K, precision) of the sweep, in the order it runs."""
    shapes = [(s, s, s) for s in SQUARE + UNALIGNED] + list(RECTANGULAR)
    out = [(m, n, k, p) for p in ("bf16", "fp16", "tf32", "fp8") for (m, n, k) in shapes]
    return out + [(s, s, s, "fp64") for s in (1024, 4096, 8192, 8200)]


def each_point_once(order: Path) -> None:
    """One GEMM launch per point inside the NVTX range "sweep", for Nsight Compute (bench/ncu_sweep.sh).

    Warm-up launches run outside the range, so with ``--nvtx-include sweep/`` the n-th profiled GEMM
    kernel is the n-th point written to ``order`` (one JSON line per point).
    """
    steps = []
    for m, n, k, precision in points():
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        step = operands(m, n, k, precision)
        if step is not None:
            step()
            steps.append(((m, n, k, precision), step))
    torch.cuda.synchronize()
    with order.open("w") as f:
        torch.cuda.nvtx.range_push("sweep")
        for (m, n, k, precision), step in steps:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"  # the kernel choice depends on it
            step()
            f.write(json.dumps({"m": m, "n": n, "k": k, "precision": precision}) + "\n")
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


def sweep(out: Path, seconds: float = 3.3, budget: float = 330.0) -> int:
    """Run the sweep into ``out``; returns the number of points run."""
    out.mkdir(parents=True, exist_ok=True)
    points_ = points()
    recorder = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet", "record", "-o", str(out / "sweep-trace.jsonl.gz"),
         "--note", "GEMM sweep (kernelfleet bench ofu)"],
    )
    time.sleep(2.0)
    began = time.monotonic()
    done = 0
    for m, n, k, precision in points_:
        if time.monotonic() - began > budget:
            print(f"budget reached: {done} of {len(points_)} points run", flush=True)
            break
        try:
            result = run_point(m, n, k, precision, seconds)
        except Exception as exc:  # noqa: BLE001 - one failed point must not end the sweep
            result = {"m": m, "n": n, "k": k, "precision": precision, "error": repr(exc)[:300]}
            print(f"{precision} {m}x{n}x{k} failed: {exc!r}"[:300], flush=True)
        torch.cuda.empty_cache()
        if result is None:
            continue
        with gzip.open(out / "sweep-points.jsonl.gz", "at") as f:
            f.write(json.dumps(result) + "\n")
        done += 1
        if "mean_flops" in result:
            print(f"{precision:5} {m:6}x{n:6}x{k:6} {result['mean_flops'] / 1e12:7.1f} TFLOP/s  {result['kernels'][-1:]}", flush=True)
        time.sleep(0.3)  # a gap between points, so windows straddling two points are easy to drop
    time.sleep(1.5)
    recorder.send_signal(signal.SIGINT)  # `record` closes its trace cleanly on Ctrl-C
    recorder.wait(timeout=30)
    return done
