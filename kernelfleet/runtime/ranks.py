"""The correctness gate with one process per device and NCCL between them (runs on GPUs, under
torchrun; ``runtime/distributed.py`` runs a rank's ops).

Rank r runs the r-th device; it captures ``slots`` replicas of the step on its own GPU, and the
ranks swap their programs (the home one defines every copy). Every slot's placement passes the
validator against the default home's capture (``runtime/plans.py``) before a rank builds it, so
every rank refuses alike. The gate runs the strategy once from the captured state, outputs zeroed:
each slot's outputs at its home must equal that capture's own replay bit for bit, on every rank.

:meth:`Rank.place_weights` frees, in each capture, the weights no launch of this rank reads, so a
plan holds its weights where it places them behind the same gate.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.replay import device_bytes, saved_state
from kernelfleet.plan.model import Device
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec, sm_groups
from kernelfleet.runtime import plans
from kernelfleet.runtime.distributed import RankBuilt, RankSlot, build_rank, run_rank, weights_read
from kernelfleet.runtime.gate import verdict
from kernelfleet.runtime.link import Throttle
from kernelfleet.runtime.replicas import capture_replicas, differing_elements, restore_all

if TYPE_CHECKING:
    from kernelfleet.workloads.steps import Step


def allocated() -> dict[int, int]:
    """Bytes this process has allocated through torch on each GPU it sees."""
    return {d: torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count())}


class Rank:
    """This process's device, its replicas and references, the step's Problem and the gate.
    ``with rank:`` runs the device on its profile. ``stages``: bytes allocated per GPU after each
    stage of setting up (what holds memory, and where)."""

    def __init__(self, make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], slots: int,
                 costs: CostTable | None = None) -> None:
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
        self.stages = {"before capture": allocated()}
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
        gathered = self.gathered([r.program for r in self.replicas])
        self.programs = [{d: gathered[j][k] for j, d in enumerate(self.devices)} for k in range(slots)]
        memory = {name: torch.cuda.get_device_properties(spec.device).total_memory for name, spec in profiles.items()}
        self.problem = plans.problem(self.programs[0][self.devices[0]], [Device(d, memory[d]) for d in self.devices],
                                     costs)
        # ranks on one GPU are processes of their own: each starts past the SM groups of those before it
        first = sum(sm_groups(profiles[d]) for d in self.devices[:rank] if profiles[d].device == self.spec.device)
        self.profile = DeviceProfile(self.spec, first_group=first)
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

    def gathered(self, value: object) -> list:
        """``value`` of every rank, in rank order (over the host group)."""
        out: list = [None] * len(self.devices)
        dist.all_gather_object(out, value, group=self.host)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.host)

    def build(self, name: str, assignments: list[list[str]], homes: list[str], throttle: Throttle | None = None,
              **options: Any) -> RankBuilt:
        """This rank's part of strategy ``name`` over the first ``len(assignments)`` slots, once
        every slot passed the validator; ``options`` as ``distributed.build_rank``'s. ``release_rank`` it."""
        plans.check_slots(self.problem, name, assignments, homes)
        slots = [RankSlot(self.programs[k], self.replicas[k], a, h) for k, (a, h) in enumerate(zip(assignments, homes))]
        return build_rank(slots, self.device, device_bytes, throttle, **options)

    def run(self, built: RankBuilt, priorities: bool = False) -> None:
        """Issue this rank's ops of ``built`` (earlier slots' compute first with ``priorities``)."""
        run_rank(built, self.prioritised if priorities else self.compute, self.copy, self.rank_of, self.pace)

    def gate(self, built: RankBuilt, homes: list[str], priorities: bool = False) -> str:
        """Run ``built`` once on every rank from the captured state, outputs zeroed: the gate's
        verdict (``gate.verdict``) over every rank's home slots, the same on every rank."""
        restore_all(self.restores)
        mine = [k for k, home in enumerate(homes) if home == self.device]
        for k in mine:
            for t in self.replicas[k].captured.output_tensors():
                t.fill_(0)
        self.barrier()
        self.run(built, priorities)
        torch.cuda.synchronize()
        self.barrier()
        wrong = {k: differing_elements(self.references[k], self.replicas[k].captured.output_tensors()) for k in mine}
        return verdict({k: n for part in self.gathered(wrong) for k, n in part.items() if n})

    def place_weights(self, assignments: list[list[str]]) -> int:
        """Free, in each slot's capture, the weight tensors none of this rank's launches (slot k:
        ``assignments[k]``) read, and save the captured state again without them; returns the bytes
        freed. The gate then shows nothing needed went."""
        restore_all(self.restores)
        freed = 0
        self.restores = []
        for replica, assignment in zip(self.replicas, assignments):
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
        """Bytes torch has allocated on this rank's GPU and bytes in use there at all."""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        return {"allocated_bytes": torch.cuda.memory_allocated(), "device_used_bytes": total - free}
