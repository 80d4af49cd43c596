"""``kernelfleet bench disagg-nccl``: bench disagg's strategies with one process per device and
NCCL between them (``runtime/distributed.py``), started by torchrun (runs on GPUs):

    torchrun --nproc-per-node 2 -m kernelfleet bench disagg-nccl llama8b-decode --plans PLANS

Rank r runs the r-th profile of ``--device``; each rank captures ``slots`` replicas of the step on
its own GPU, and the ranks swap their programs (the home one defines every copy). A strategy is
gated as in bench disagg — each slot's outputs at its home equal, bit for bit, that capture's own
replay — before it is timed, and a failing one is reported, never timed. Its time is the median
over ``repeats`` of: a host barrier, every rank issuing its ops, every rank synchronising, a host
barrier (rank 0's clock; the two barriers alone, measured the same way, are reported beside it).
Paced links pace each copy on its receiving rank (``runtime/distributed.py``); priorities give
earlier slots' compute streams the higher priority.

With ``place_weights`` (a plan's policy), only that plan runs, twice: with every weight on every
GPU, then after each rank freed the weights its own launches never read (``runtime/distributed.py:
weights_read``); beside each its memory per rank, so the second row shows a plan's weights held
where it places them, behind the same gate.
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

from kernelfleet.bench.disagg import (Strategy, capture_replicas, differing_elements, load_plans, restore_all, show,
                                     strategies)
from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.replay import device_bytes, saved_state
from kernelfleet.costs.table import CostTable
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec
from kernelfleet.runtime.distributed import RankSlot, build_rank, release_rank, run_rank, weights_read
from kernelfleet.plan.slots import estimate
from kernelfleet.workloads.steps import Step


def allocated() -> dict[int, int]:
    """Bytes this process has allocated through torch on each GPU it sees."""
    return {d: torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count())}


class Rank:
    """This process's device, its replicas and references, and the gate-then-time loop."""

    def __init__(self, make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], slots: int) -> None:
        self.devices = list(profiles)
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        if world != len(self.devices):
            raise UsageError(f"torchrun started {world} processes for {len(self.devices)} devices: give "
                             f"--nproc-per-node {len(self.devices)}")
        self.rank, self.device = rank, self.devices[rank]
        self.spec = profiles[self.device]
        torch.cuda.set_device(self.spec.device)
        dist.init_process_group("nccl", device_id=torch.device(f"cuda:{self.spec.device}"))
        self.host = dist.new_group(backend="gloo")  # barriers and small results, off the GPUs
        self.rank_of = {d: k for k, d in enumerate(self.devices)}
        self.replicas, self.restores = [], []
        self.stages = {"before capture": allocated()}  # what holds memory, and where
        for k in range(slots):
            replicas, restores = capture_replicas(make_step, {self.device: self.spec.device}, k)
            self.replicas.append(replicas[self.device])
            self.restores += restores
            self.stages[f"slot {k} captured"] = allocated()
        restore_all(self.restores)
        for replica in self.replicas:
            replica.captured.replay()
        torch.cuda.synchronize()
        self.references = [[t.clone() for t in r.captured.output_tensors()] for r in self.replicas]
        self.stages["references"] = allocated()
        restore_all(self.restores)
        gathered: list = [None] * len(self.devices)
        dist.all_gather_object(gathered, [r.program for r in self.replicas], group=self.host)
        self.programs = [{d: gathered[j][k] for j, d in enumerate(self.devices)} for k in range(slots)]
        self.profile = DeviceProfile(self.spec)
        self.compute = {k: torch.cuda.Stream() for k in range(slots)}
        # earlier slots first; torch maps a priority past the device's range to its nearest end
        self.prioritised = {k: torch.cuda.Stream(priority=k - slots + 1) for k in range(slots)}
        self.copy, self.pace = torch.cuda.Stream(), torch.cuda.Stream()

    def __enter__(self) -> Rank:
        self.profile.__enter__()
        self.stages["profile entered"] = allocated()
        for replica in self.replicas:
            replica.context = self.profile.context
        return self

    def __exit__(self, *exc: object) -> None:
        self.profile.__exit__(*exc)

    def place_weights(self, strategy: Strategy) -> int:
        """Free, in each slot's capture, the weight tensors none of this rank's launches of
        ``strategy`` read, and save the captured state again without them; returns the bytes
        freed. The gate then shows nothing needed went."""
        restore_all(self.restores)
        freed = 0
        self.restores = []
        for replica, assignment in zip(self.replicas, strategy.assignments):
            released: list[tuple[int, int]] = []
            weights = [(b.address, b.address + b.size_bytes) for b in replica.program.buffers if b.role == "weight"]
            keep = weights_read(replica.program, assignment, self.device)
            module = replica.captured.keep[1]
            seen: set[int] = set()
            for _, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
                start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
                if end == start or not any(s < end and start < e for s, e in weights) \
                        or any(s < end and start < e for s, e in keep):
                    continue
                if start not in seen:
                    seen.add(start)
                    freed += end - start
                    released.append((start, end))
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            self.restores.append(saved_state(replica.program, released))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return freed

    def memory(self) -> dict:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        return {"allocated_bytes": torch.cuda.memory_allocated(), "device_used_bytes": total - free}

    def gathered(self, value: object) -> list:
        out: list = [None] * len(self.devices)
        dist.all_gather_object(out, value, group=self.host)
        return out

    def round(self, built=None, priorities: bool = False) -> tuple[float, float]:
        """(seconds from barrier to barrier, seconds issuing ops) for one run of ``built`` (None: nothing)."""
        dist.barrier(group=self.host)
        start = time.perf_counter()
        if built is not None:
            run_rank(built, self.prioritised if priorities else self.compute, self.copy, self.rank_of, self.pace)
        issued = time.perf_counter() - start
        torch.cuda.synchronize()
        dist.barrier(group=self.host)
        return time.perf_counter() - start, issued

    def measure(self, strategy: Strategy, repeats: int) -> dict:
        used = len(strategy.assignments)
        slots = [RankSlot(self.programs[k], self.replicas[k], a, h)
                 for k, (a, h) in enumerate(zip(strategy.assignments, strategy.homes))]
        options = {"overlap": strategy.options.get("overlap", True),
                   "slot_mode": strategy.options.get("slot_mode", "sequential"), "seconds": strategy.options.get("seconds")}
        try:
            built = build_rank(slots, self.device, device_bytes, strategy.options.get("throttle"), **options)
        except Exception as exc:  # every rank builds the same list, so all refuse alike
            return {"gate": f"refused: {exc}"}
        try:
            restore_all(self.restores)
            mine = [k for k in range(used) if strategy.homes[k] == self.device]
            for k in mine:
                for t in self.replicas[k].captured.output_tensors():
                    t.fill_(0)
            priorities = bool(strategy.options.get("priorities"))
            self.round(built, priorities)
            wrong = {k: differing_elements(self.references[k], self.replicas[k].captured.output_tensors()) for k in mine}
            wrong = {k: n for part in self.gathered(wrong) for k, n in part.items() if n}
            if wrong:
                return {"gate": f"outputs differ from the single-device run (slot: elements) {wrong}"}
            rounds = [self.round(built, priorities) for _ in range(repeats)]
            idle = statistics.median(self.round()[0] for _ in range(repeats))
            median = statistics.median(r[0] for r in rounds)
            return {"gate": "identical", "seconds": median, "slots": used, "slots_per_second": used / median,
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
    rank = Rank(make_step, profiles, slots)
    program = rank.replicas[0].program
    loaded = load_plans(plans, program, rank.devices)
    if costs is not None and len(costs.seconds) != len(program.launches):
        raise UsageError(f"the cost table has {len(costs.seconds)} launches, the captured step "
                         f"{len(program.launches)}: it was made for another program")
    seconds = estimate(costs) if costs is not None else None
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
            _every_strategy(rank, loaded, slots, repeats, seconds, results, out, console)
    if rank.rank == 0:
        (out / "disagg-nccl.json").write_text(json.dumps(results, indent=1, default=str))
    dist.barrier(group=rank.host)
    dist.destroy_process_group()
    if rank.rank != 0:
        return None
    show(results, console)
    return results


def _placed(rank: Rank, plan, slots: int, repeats: int, results: dict, console: Console) -> None:
    """The plan with every weight on every GPU, then with its weights placed (module docstring)."""
    home = plan.details.home or rank.devices[0]
    strategy = Strategy(plan.policy, [plan.assignment] * slots, [home] * slots, model_seconds=plan.objective_seconds)
    for label, place in ((f"{plan.policy}, every weight everywhere", False), (f"{plan.policy}, weights placed", True)):
        memory = {"freed_bytes": rank.place_weights(strategy) if place else 0}
        memory.update(rank.memory())
        found = rank.measure(strategy, repeats)
        found["memory"] = dict(zip(rank.devices, rank.gathered(memory)))
        results["strategies"][label] = found
        if rank.rank == 0:
            used = ", ".join(f"{d} {m['device_used_bytes'] / 1e9:.1f} GB" for d, m in found["memory"].items())
            console.print(f"{label}: {found['gate'][:80]}; GPU memory in use: {used}")


def _every_strategy(rank: Rank, loaded: dict, slots: int, repeats: int, seconds, results: dict, out: Path,
                    console: Console) -> None:
    n = len(rank.replicas[0].program.launches)
    todo = strategies(loaded, rank.devices, slots, None, n)
    for pass_ in range(2):  # the singles first: request distribution splits slots by their rates
        for s in todo:
            found = rank.measure(s, repeats)
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
