"""The correctness gate for the plan executor, on one GPU or two (runs on GPUs).

    python3 bench/executor_check.py --out DIR [--devices 0,0] [--steps llama-decode,...]

Captures each step once per replica ("A" on the first device, "B" on the second; ``0,0`` puts
both replicas on one GPU, at different addresses, which exercises every copy the same way), then
runs it under several plans — all on A, all on B, first half A / second half B, and random
placements — and checks that the home replica's outputs equal, bit for bit, those of A's own
graph replay from the same state. Prints one line per plan with its copies and time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten

from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.capture import capture
from kernelfleet.kernels.replay import saved_state
from kernelfleet.runtime.executor import Replica, build, release, run
from kernelfleet.workloads.steps import make

STEPS = {
    "llama-decode": ("llama", "tiny", "decode", {}),
    "llama-prefill": ("llama", "tiny", "prefill", {}),
    "mamba-decode": ("mamba", "tiny", "decode", {}),
    "moe-decode": ("moe", "tiny", "decode", {}),
    "llama8b-decode": ("llama", "h200", "decode", {}),
}


def outputs(captured) -> list[torch.Tensor]:
    return [t for t in tree_flatten(captured.outputs)[0] if isinstance(t, torch.Tensor)]


def copy_node_probe(home) -> None:
    """cuGraphAddMemcpyNode was refused in this process on the H200 but not in a fresh one: try it
    here on fresh tensors and on the home replica's own memory, directly and via the fallback."""
    from kernelfleet.kernels import driver

    a = torch.arange(256, dtype=torch.uint8, device="cuda")
    b = torch.zeros_like(a)
    out = outputs(home)[0]
    for label, dst, src in (("fresh tensors", b.data_ptr(), a.data_ptr()),
                            ("replica output", out.data_ptr(), a.data_ptr())):
        for how in ("direct", "captured"):
            graph = driver.create_graph()
            try:
                if how == "direct":
                    driver.call("cuGraphAddMemcpyNode", graph, [], 0, _params(dst, src, 64), home.context)
                else:
                    driver._captured_copy(graph, [], dst, src, 64)
                print(f"copy node probe, {label}, {how}: ok", flush=True)
            except Exception as exc:
                print(f"copy node probe, {label}, {how}: {exc}", flush=True)
            driver.call("cuGraphDestroy", graph)


def _params(dst: int, src: int, length: int):
    from cuda.bindings import driver as cu

    p = cu.CUDA_MEMCPY3D()
    p.srcMemoryType = p.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_UNIFIED
    p.srcDevice, p.dstDevice = src, dst
    p.WidthInBytes, p.Height, p.Depth = length, 1, 1
    return p


def check_step(name: str, devices: list[int]) -> dict:
    family, preset, phase, extra = STEPS[name]
    replicas, restores = {}, []
    for label, index in zip("AB", devices):
        torch.cuda.set_device(index)
        step = make(family, preset, phase, device=f"cuda:{index}", **extra)
        captured = capture(step.fn, step.args, module=step.module, what=step.name)
        replicas[label] = Replica(captured, assemble(captured.raw))
        restores.append(saved_state(replicas[label].program))
    torch.cuda.set_device(devices[0])
    home = replicas["A"].captured

    def reset() -> None:
        for restore in restores:
            restore()
        torch.cuda.synchronize()

    copy_node_probe(home)
    reset()
    t0 = time.perf_counter()
    home.replay()
    torch.cuda.synchronize()
    single_seconds = time.perf_counter() - t0
    reference = [t.clone() for t in outputs(home)]
    n = len(replicas["A"].program.launches)
    plans = {"all-A": ["A"] * n, "all-B": ["B"] * n, "halves": ["A"] * (n // 2) + ["B"] * (n - n // 2)}
    for seed in range(3):
        rng = random.Random(seed)
        plans[f"random-{seed}"] = [rng.choice("AB") for _ in range(n)]
    results = {"step": name, "launches": n, "devices": devices, "single_graph_seconds": single_seconds, "plans": {}}
    stream = torch.cuda.current_stream().cuda_stream
    for plan_name, assignment in plans.items():
        try:
            built = build(replicas, assignment, "A")
        except Exception as exc:  # a plan the replicas cannot run is reported, never benchmarked
            results["plans"][plan_name] = {"error": str(exc)}
            print(f"{name} {plan_name}: REFUSED {exc}", flush=True)
            continue
        reset()
        for t in outputs(home):
            t.fill_(0)
        t0 = time.perf_counter()
        run(built, stream)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        same = all(torch.equal(a, b) for a, b in zip(reference, outputs(home)))
        release(built)
        results["plans"][plan_name] = {"bit_identical": same, "copies": len(built.copies),
                                       "copy_bytes": built.copy_bytes, "nodes": built.nodes, "seconds": seconds,
                                       "on_B": assignment.count("B")}
        print(f"{name} {plan_name:9}: {'identical' if same else 'DIFFERENT'} outputs, {assignment.count('B')}/{n} "
              f"launches on B, {len(built.copies)} copies ({built.copy_bytes / 1e6:.1f} MB), "
              f"{seconds * 1e3:.1f} ms (single graph {single_seconds * 1e3:.1f} ms)", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", default="0,0")
    parser.add_argument("--steps", default="llama-decode,llama-prefill,mamba-decode,moe-decode,llama8b-decode")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"command: {' '.join([sys.executable] + sys.argv)}", flush=True)
    devices = [int(d) for d in args.devices.split(",")]
    for name in args.steps.split(","):
        try:
            result = check_step(name, devices)
            (args.out / f"executor-{name}.json").write_text(json.dumps(result, indent=1))
        except Exception:
            print(f"[FAILED] {name}", flush=True)
            traceback.print_exc()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
