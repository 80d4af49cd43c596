"""The correctness gate with one process per device and NCCL between them (runs on GPUs, under
torchrun; ``runtime/distributed.py`` runs a rank's ops).

Rank r runs the r-th device; it captures ``slots`` replicas of the step on its own GPU with the
device's kernels (``profile.devices.KERNELS``), and the ranks swap their programs (the home one
defines every copy). Where two ranks launch different kernels, the ranks swap their captures too
and every rank lines them up into the same units (``graph/units.py``), which plans then place.
Every slot's placement passes the validator against the default home's capture (``runtime/plans.py``)
before a rank builds it, so every rank refuses alike. The gate runs the strategy once from the
captured state, outputs zeroed: each slot's outputs at its home must equal that capture's own
replay bit for bit, on every rank, or with units agree with it within ``runtime/gate.py``'s
tolerance, over decode steps too for a decode step.

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
from kernelfleet.graph.units import UnitView
from kernelfleet.kernels.cuda.replay import device_bytes, saved_state
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.model import Device
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec, sm_groups
from kernelfleet.runtime import plans
from kernelfleet.runtime.distributed import RankBuilt, RankSlot, build_rank, run_rank, weights_read
from kernelfleet.runtime.executor import Replica
from kernelfleet.runtime.gate import (
    DECODE_STEPS,
    agreement,
    decode_gate,
    decode_report,
    decode_steps,
    passed,
    tolerance,
    verdict,
    zero,
)
from kernelfleet.runtime.link import Throttle
from kernelfleet.runtime.replicas import capture_replicas, differing_elements, restore_all, units_across

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
            replicas, restores = capture_replicas(make_step, {self.device: self.spec.device}, k,
                                                  {self.device: self.spec.kernels})
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
        self.programs: list[dict[str, Program]] = []
        self.units: list[dict[str, UnitView] | None] = []  # each slot's units, where the ranks' kernels differ
        gathered = self.gathered([(r.captured.raw, r.program) for r in self.replicas])
        for k, replica in enumerate(self.replicas):
            programs = {d: gathered[j][k][1] for j, d in enumerate(self.devices)}
            units = units_across({d: gathered[j][k][0] for j, d in enumerate(self.devices)}, programs)
            if units is not None:
                programs = {d: view.program for d, view in units.items()}
                self.replicas[k] = Replica(replica.captured, programs[self.device], units=units[self.device],
                                           decode=replica.decode)
            self.programs.append(programs)
            self.units.append(units)
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
        slots = [RankSlot(self.programs[k], self.replicas[k], a, h, self.units[k])
                 for k, (a, h) in enumerate(zip(assignments, homes))]
        if self.units[0] is not None:  # units: each device's nodes in capture order (gate.Gate.graph says why)
            options["overlap"] = False
        return build_rank(slots, self.device, device_bytes, throttle, **options)

    def run(self, built: RankBuilt, priorities: bool = False) -> None:
        """Issue this rank's ops of ``built`` (earlier slots' compute first with ``priorities``)."""
        run_rank(built, self.prioritised if priorities else self.compute, self.copy, self.rank_of, self.pace)

    def gate(self, built: RankBuilt, homes: list[str], priorities: bool = False) -> str:
        """Run ``built`` once on every rank from the captured state, outputs zeroed: the gate's
        verdict over every rank's home slots, the same on every rank: bit for bit
        (``gate.verdict``), or where the ranks captured different kernels the tolerance of
        ``runtime/gate.py`` (over decode steps too, for a decode step)."""
        restore_all(self.restores)
        mine = [k for k, home in enumerate(homes) if home == self.device]
        for k in mine:
            zero(self.replicas[k].captured.output_tensors())
        self.barrier()
        self.run(built, priorities)
        torch.cuda.synchronize()
        self.barrier()
        wrong = {k: differing_elements(self.references[k], self.replicas[k].captured.output_tensors()) for k in mine}
        wrong = {k: n for part in self.gathered(wrong) for k, n in part.items() if n}
        if not wrong or self.units[0] is None:
            return verdict(wrong)
        found = [agreement(ref, out) for k in mine
                 for ref, out in zip(self.references[k], self.replicas[k].captured.output_tensors())]
        said = tolerance([a for part in self.gathered(found) for a in part])
        if not passed(said) or self.replicas[0].decode is None:
            return said
        return decode_gate(said, self._decode_verdict(built, homes[0], priorities))

    def _decode_verdict(self, built: RankBuilt, home: str, priorities: bool) -> tuple[bool, str]:
        """``gate.Gate.decode_verdict`` across the ranks: every rank feeds the same decode steps to
        its own capture's inputs (they are the same step's) and runs each step's ops, so all take as
        many steps; slot 0's home alone decodes its own replay too and compares. Home's verdict."""
        replica = self.replicas[0]

        def decoded(step: Callable[[], None], forced: bool) -> tuple[torch.Tensor, list[list[int]]]:
            restore_all(self.restores)
            try:
                return decode_steps(step, replica.captured.args, replica.decode,
                                    lambda: replica.captured.output_tensors()[0], forced, DECODE_STEPS,
                                    torch.cuda.synchronize)
            finally:
                restore_all(self.restores)

        def placed() -> None:
            self.run(built, priorities)

        forced, free = decoded(placed, True)[0], decoded(placed, False)[1]  # every rank, in the same order
        report = None if self.device != home else decode_report(
            agreement(decoded(replica.captured.replay, True)[0], forced), decoded(replica.captured.replay, False)[1],
            free)
        return self.gathered(report)[self.rank_of[home]]

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
