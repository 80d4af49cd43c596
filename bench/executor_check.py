"""The correctness gate for the plan executor, on one GPU or two (runs on GPUs).

    python -m bench.executor_check --out DIR [--devices 0,0] [--steps llama-decode,...]

Captures each step once per replica ("A" on the first device, "B" on the second; ``0,0`` puts
both replicas on one GPU, at different addresses, which exercises every copy the same way), then
runs it under several plans — all on A, all on B, first half A / second half B, and random
placements; on halves also each copy method (runtime/link.py), the conservative schedule and
links paced to 200 and 25 Gbit/s — and checks that the home replica's outputs equal, bit for bit,
those of A's own graph replay from the same state. A plan whose graph the CPU finds racy, or
whose copies cannot be placed in B's capture, is refused before it runs. Prints one line per
plan with its copies and time; each step runs in a process of its own (a device-side assert
ends that step only). First it probes each copy method on fresh tensors and the replica's memory.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import torch

from bench import Parser, command_line
from kernelfleet.plan.model import Device
from kernelfleet.profile.timing import median_seconds
from kernelfleet.runtime import plans
from kernelfleet.runtime.executor import Slot, build, release, run
from kernelfleet.runtime.link import METHODS, LinkKernels, Throttle, add_copy
from kernelfleet.runtime.replicas import capture_replicas, restore_all
from kernelfleet.workloads.steps import reference


def copy_probe(home) -> dict:
    """Each copy method (runtime/link.METHODS) on fresh tensors and into the home replica's own
    memory: does the driver accept the node, and does the graph move the right bytes?"""
    from kernelfleet.kernels.cuda.driver import CUDA as driver

    found = {}
    src = torch.arange(256, dtype=torch.uint8, device="cuda")
    kernels = LinkKernels(home.context)
    for label, dst in (("fresh tensor", torch.zeros_like(src)), ("replica output", home.output_tensors()[0])):
        for method in METHODS:
            view = dst.view(torch.uint8).view(-1)[:100]
            view.zero_()
            torch.cuda.synchronize()
            graph, executable = driver.create_graph(), None
            try:
                add_copy(method, graph, [], view.data_ptr() + 3, src.data_ptr() + 1, 64, kernels)
                executable = driver.instantiate(graph)
                driver.launch(executable, torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                right = bool(torch.equal(view[3:67], src[1:65])) and int(view[:3].sum() + view[67:].sum()) == 0
                found[f"{label}, {method}"] = "ok" if right else "WRONG BYTES"
            except Exception as exc:
                found[f"{label}, {method}"] = str(exc)
            driver.destroy(graph, executable)
            print(f"copy probe, {label}, {method}: {found[f'{label}, {method}']}", flush=True)
    kernels.close()
    return found


def variants(n: int) -> dict[str, tuple[list[str], dict]]:
    """Plans (all on A, all on B, halves, random) and, on halves, each copy method and two emulated links."""
    halves = ["A"] * (n // 2) + ["B"] * (n - n // 2)
    out = {"all-A": (["A"] * n, {}), "all-B": (["B"] * n, {}), "halves": (halves, {})}
    for seed in range(3):
        rng = random.Random(seed)
        out[f"random-{seed}"] = ([rng.choice("AB") for _ in range(n)], {})
    for method in METHODS:
        out[f"halves/{method}"] = (halves, {"method": method})
    out["halves/conservative"] = (halves, {"overlap": False})
    for gbit in (200, 25):
        out[f"halves/link-{gbit}Gbit"] = (halves, {"throttle": Throttle(gbit * 1e9 / 8, 5e-6)})
    return out


def check_step(name: str, devices: list[int], out: Path) -> None:
    replicas, restores = capture_replicas(lambda where, seed: reference(name, device=where, seed=seed),
                                          dict(zip("AB", devices)))
    torch.cuda.set_device(devices[0])
    home = replicas["A"].captured
    on = torch.cuda.Stream()  # the executor launches on a stream of its own
    stream = on.cuda_stream

    def reset() -> None:
        restore_all(restores)

    results = {"step": name, "devices": devices, "copy_probe": copy_probe(home), "plans": {}}
    reset()
    home.replay()
    torch.cuda.synchronize()
    expected = [t.clone() for t in home.output_tensors()]
    single_seconds = median_seconds(home.replay, torch.cuda.current_stream())
    n = len(replicas["A"].program.launches)
    results.update(launches=n, single_graph_seconds=single_seconds)
    problem = plans.problem(replicas["A"].program, [Device("A"), Device("B")])
    for plan_name, (assignment, options) in variants(n).items():
        try:
            plans.check_slots(problem, plan_name, [assignment], ["A"])  # the executor builds only what passed
            built = build([Slot(replicas, assignment, "A")], **options)
        except Exception as exc:  # an invalid or racy plan, or one the replicas cannot run: reported, never timed
            results["plans"][plan_name] = {"error": str(exc)}
            print(f"{name} {plan_name}: REFUSED {exc}", flush=True)
            continue
        reset()
        for t in home.output_tensors():
            t.fill_(0)
        run(built, stream)
        torch.cuda.synchronize()
        same = all(torch.equal(a, b) for a, b in zip(expected, home.output_tensors()))
        seconds = median_seconds(lambda: run(built, stream), on) if same else None  # a failing plan is never timed
        release(built)
        throttle = options.get("throttle")
        link_seconds = sum(throttle.seconds(t.length_bytes) for t in built.copies) if throttle else None
        results["plans"][plan_name] = {"bit_identical": same, "copies": len(built.copies), "method": built.method,
                                       "copy_bytes": built.copy_bytes, "nodes": built.nodes, "seconds": seconds,
                                       "on_B": assignment.count("B"), "emulated_link_seconds": link_seconds}
        out.write_text(json.dumps(results, indent=1))  # after every plan: a later fault loses nothing
        timing = f"{seconds * 1e3:.2f} ms" if same else "not timed"
        link = f", emulated link total {link_seconds * 1e3:.2f} ms" if throttle else ""
        print(f"{name} {plan_name:22}: {'identical' if same else 'DIFFERENT'} outputs, {assignment.count('B')}/{n} "
              f"on B, {len(built.copies)} copies ({built.copy_bytes / 1e6:.2f} MB, {built.method}), {timing} "
              f"(single graph {single_seconds * 1e3:.2f} ms){link}", flush=True)
    out.write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = Parser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", default="0,0")
    parser.add_argument("--steps", default="llama-decode,llama-prefill,mamba-decode,moe-decode,llama8b-decode")
    parser.add_argument("--only", help="check this one step in this process (the parent runs each step so)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    devices = [int(d) for d in args.devices.split(",")]
    if args.only:
        check_step(args.only, devices, args.out / f"executor-{args.only}.json")
        return
    print(f"command: {command_line()}", flush=True)
    for name in args.steps.split(","):  # a process each: a device-side assert ends one step only
        command = [sys.executable, "-m", "bench.executor_check", "--out", str(args.out), "--devices", args.devices,
                   "--only", name]
        print(f"== {name}: exit {subprocess.run(command).returncode}", flush=True)


if __name__ == "__main__":
    main()
