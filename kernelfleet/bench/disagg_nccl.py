"""``kernelfleet bench disagg-nccl``: bench disagg's strategies with one process per device and
NCCL between them (``runtime/distributed.py``), started by torchrun (runs on GPUs):

    torchrun --nproc-per-node 2 -m kernelfleet bench disagg-nccl llama8b-decode --plans PLANS

Rank r runs the r-th profile of ``--device`` (``runtime/ranks.py``: its replicas, captured with
its own kernels, the validator and the gate). A strategy is gated as in bench disagg — each slot's
outputs at its home equal, bit for bit, that capture's own replay, or where the ranks captured
different kernels agree within the tolerance gate — before it is timed, and a failing one is
reported, never timed. Its time is the median
over ``repeats`` of: a host barrier, every rank issuing its ops, every rank synchronising, a host
barrier (rank 0's clock; the two barriers alone, measured the same way, are reported beside it).
Paced links pace each copy on its receiving rank (``runtime/distributed.py``); priorities give
earlier slots' compute streams the higher priority.

With ``place_weights`` (a plan's policy), only that plan runs, twice: with every weight on every
GPU, then after each rank freed the weights its own launches never read (``runtime/distributed.py:
weights_read``); beside each its memory per rank, so the second row shows a plan's weights held
where it places them, behind the same gate (``Rank.place_weights``).

Given the cost table (``--costs``), each row carries the graph time the one-process path predicts
for it (``bench.disagg.prediction``: ``contention.predict`` in its slot mode, with the table's
shared and free factors and measured link), as ``bench disagg`` does. It prices a copy as a graph
memcpy node (the table's link, else 4 µs + bytes at 25 GB/s): the ranks' copies are NCCL sends
instead, which that model has not measured, so the difference is the processes' own cost.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console

from kernelfleet.bench.disagg import Strategy, prediction, show, strategies
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.plan.contention import Contention
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.model import Plan
from kernelfleet.plan.schedule import Node
from kernelfleet.plan.slots import estimate, uniform_link
from kernelfleet.profile.devices import ProfileSpec
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.distributed import RankBuilt, release_rank
from kernelfleet.runtime.gate import passed
from kernelfleet.runtime.ranks import Rank
from kernelfleet.workloads.steps import Step


def round_seconds(rank: Rank, built: RankBuilt | None = None, priorities: bool = False) -> tuple[float, float]:
    """(seconds from barrier to barrier, seconds issuing ops) for one run of ``built`` (None: nothing)."""
    rank.barrier()
    start = time.perf_counter()
    if built is not None:
        rank.run(built, priorities)
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    rank.barrier()
    return time.perf_counter() - start, issued


def measure(rank: Rank, strategy: Strategy, repeats: int, seconds: Callable[[int, Node], float] | None = None,
            contention: Contention | None = None) -> dict:
    """Gate the strategy on every rank, then time it (module docstring); a refused or failing one
    is reported, never timed. Beside its time, the one-process path's prediction of its graph
    (``bench.disagg.prediction``) where ``seconds`` estimates each node."""
    used = len(strategy.assignments)
    options = {"overlap": strategy.options.get("overlap", True),
               "slot_mode": strategy.options.get("slot_mode", "sequential"), "seconds": strategy.options.get("seconds")}
    try:
        built = rank.build(strategy.name, strategy.assignments, strategy.homes, strategy.options.get("throttle"),
                           **options)
    except Exception as exc:  # every rank builds the same list, so all refuse alike
        return {"gate": f"refused: {exc}"}
    try:
        priorities = bool(strategy.options.get("priorities"))
        gate = rank.gate(built, strategy.homes, priorities)
        if not passed(gate):
            return {"gate": gate}
        rounds = [round_seconds(rank, built, priorities) for _ in range(repeats)]
        idle = statistics.median(round_seconds(rank)[0] for _ in range(repeats))
        median = statistics.median(r[0] for r in rounds)
        return {"gate": gate, "seconds": median, "slots": used, "slots_per_second": used / median,
                "predicted_seconds": prediction(built.combined, strategy, seconds, contention),
                "barrier_seconds": idle, "issue_seconds": statistics.median(r[1] for r in rounds),
                "segments": sum(op.kind == "segment" for op in built.ops),
                "copies": sum(op.kind != "segment" for op in built.ops), "copy_bytes": built.copy_bytes,
                "method": "nccl"}
    finally:
        torch.cuda.synchronize()
        release_rank(built)


def disagg_nccl(make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], plans: Path, slots: int,
                repeats: int, out: Path, console: Console, costs: CostTable | None = None,
                place_weights: str | None = None) -> dict | None:
    """Every strategy (module docstring) across processes, or with ``place_weights`` that plan
    before and after placing its weights; rank 0 writes ``out/disagg-nccl.json`` and returns the
    results (other ranks None)."""
    if slots < 2:
        raise UsageError(f"--slots must be at least 2 (request distribution needs one per device), got {slots}")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UsageError("run it under torchrun, one process per device: torchrun --nproc-per-node 2 -m kernelfleet "
                         "bench disagg-nccl STEP --plans PLANS")
    rank = Rank(make_step, profiles, slots, costs)
    loaded = runtime_plans.load(plans, rank.problem)
    seconds = estimate(costs, uniform_link(COPY_US, LINK_GBPS)) if costs is not None else None
    contention = Contention.of(costs)
    results: dict = {"command": " ".join(["torchrun ... kernelfleet"] + sys.argv[1:]), "processes": len(rank.devices),
                     "devices": {n: asdict(s) for n, s in profiles.items()}, "slots": slots, "strategies": {}}
    if place_weights is not None and place_weights not in loaded:
        raise UsageError(f"--place-weights {place_weights}: {plans} has no such plan (it has {', '.join(loaded)})")
    if rank.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    with rank:
        results["allocated_bytes_by_stage"] = dict(zip(rank.devices, rank.gathered(rank.stages)))
        if place_weights is not None:
            _placed(rank, loaded[place_weights], slots, repeats, results, console)
        else:
            _every_strategy(rank, loaded, slots, repeats, seconds, contention, results, out, console)
    if rank.rank == 0:
        (out / "disagg-nccl.json").write_text(json.dumps(results, indent=1, default=str))
    rank.barrier()
    dist.destroy_process_group()
    if rank.rank != 0:
        return None
    show(results, console)
    return results


def _placed(rank: Rank, plan: Plan, slots: int, repeats: int, results: dict, console: Console) -> None:
    """The plan with every weight on every GPU, then with its weights placed (module docstring)."""
    home = plan.details.home or rank.devices[0]
    strategy = Strategy(plan.policy, [plan.assignment] * slots, [home] * slots, model_seconds=plan.objective_seconds)
    for label, place in ((f"{plan.policy}, every weight everywhere", False), (f"{plan.policy}, weights placed", True)):
        memory = {"freed_bytes": rank.place_weights(strategy.assignments) if place else 0}
        memory.update(rank.memory())
        found = measure(rank, strategy, repeats)
        found["memory"] = dict(zip(rank.devices, rank.gathered(memory)))
        results["strategies"][label] = found
        if rank.rank == 0:
            used = ", ".join(f"{d} {m['device_used_bytes'] / 1e9:.1f} GB" for d, m in found["memory"].items())
            console.print(f"{label}: {found['gate'][:80]}; GPU memory in use: {used}")


def _every_strategy(rank: Rank, loaded: dict, slots: int, repeats: int, seconds, contention: Contention,
                    results: dict, out: Path, console: Console) -> None:
    n = len(rank.replicas[0].program.launches)
    todo = strategies(loaded, rank.devices, slots, None, n)
    for pass_ in range(2):  # the singles first: request distribution splits slots by their rates
        for s in todo:
            found = measure(rank, s, repeats, seconds, contention)
            found["model_seconds"] = s.model_seconds
            results["strategies"][s.name] = found
            if rank.rank == 0:
                console.print(f"{s.name}: {found['gate'][:80]}"
                              + (f", {found['seconds'] * 1e3:.2f} ms" if "seconds" in found else ""))
                (out / "disagg-nccl.json").write_text(json.dumps(results, indent=1, default=str))
        if pass_ == 0:
            rates = {d: results["strategies"][f"single:{d}"].get("slots_per_second") for d in rank.devices}
            if None in rates.values():
                break
            todo = strategies(loaded, rank.devices, slots, rates, n, seconds)
