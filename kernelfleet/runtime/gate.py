"""The correctness gate (DESIGN, place step 7): a placement must give the single-device outputs
before any figure of it is reported (runs on GPUs).

A :class:`Gate` holds ``slots`` micro-batches of a step, each with a replica per device
(``runtime/replicas.py``), and each slot's references: every capture's own graph replay on its
whole GPU, from the captured state. :meth:`Gate.graph` builds a strategy's graph after every slot's
placement passed the validator (``runtime/plans.py``); :meth:`Gate.gate` runs it once from the
captured state with the outputs zeroed (so only a run that writes them can match) and answers
:data:`IDENTICAL` when each slot's outputs at its home equal its own capture's replay bit for bit,
else what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.model import Device
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec
from kernelfleet.runtime import plans
from kernelfleet.runtime.executor import Built, Replica, Slot, build, run
from kernelfleet.runtime.replicas import capture_replicas, differing_elements, restore_all

if TYPE_CHECKING:
    from kernelfleet.workloads.steps import Step

IDENTICAL = "identical"


class Gate:
    """Replicas of the step per slot and device, their references, the step's Problem (what plans
    are checked against) and the gate. ``with gate:`` runs each device on its profile.

    ``make_step(torch device, seed)``: the step, slot k seeded k; ``profiles``: the devices by the
    names the plans use, the first the default home; ``costs``: the table the plans were made from,
    or None; ``progress``: wraps the slots' loop (e.g. a progress bar)."""

    def __init__(self, make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], slots: int,
                 costs: CostTable | None = None,
                 progress: Callable[[Iterable[int]], Iterable[int]] = lambda each: each) -> None:
        self.devices = list(profiles)
        self.slots: list[dict[str, Replica]] = []
        self.restores: list[Callable[[], None]] = []
        for k in progress(range(slots)):
            replicas, restores = capture_replicas(make_step, {name: spec.device for name, spec in profiles.items()}, k)
            self.slots.append(replicas)
            self.restores += restores
        self.reset()
        self.references = []
        for replicas in self.slots:  # each capture's own graph replay, whole GPU, from the captured state
            for name, replica in replicas.items():
                with torch.cuda.device(profiles[name].device):
                    replica.captured.replay()
            torch.cuda.synchronize()
            self.references.append({d: [t.clone() for t in r.captured.output_tensors()] for d, r in replicas.items()})
        self.reset()
        self.profiles = {name: DeviceProfile(spec) for name, spec in profiles.items()}
        memory = {name: torch.cuda.get_device_properties(spec.device).total_memory for name, spec in profiles.items()}
        self.problem = plans.problem(self.program, [Device(d, memory[d]) for d in self.devices], costs)

    def reset(self) -> None:
        restore_all(self.restores)

    def __enter__(self) -> Gate:
        for name, profile in self.profiles.items():
            profile.__enter__()
            for replicas in self.slots:
                replicas[name].context = profile.context
        return self

    def __exit__(self, *exc: object) -> None:
        for profile in self.profiles.values():
            profile.__exit__(*exc)

    @property
    def program(self) -> Program:
        """The step as the default home captured it: what plans are checked against."""
        return self.slots[0][self.devices[0]].program

    def graph(self, name: str, assignments: list[list[str]], homes: list[str], **options) -> Built:
        """The graph of strategy ``name`` over the first ``len(assignments)`` slots (slot k: launch i
        on ``assignments[k][i]``, outputs at ``homes[k]``), once every slot passed the validator;
        ``options`` as ``executor.build``'s, state resident by default. ``release`` it."""
        plans.check_slots(self.problem, name, assignments, homes)
        used = self.slots[:len(assignments)]
        options = {"resident_state": True, **options}
        return build([Slot(r, a, h) for r, a, h in zip(used, assignments, homes)], **options)

    def clear_outputs(self, homes: list[str]) -> None:
        """Zero the outputs of slot k at ``homes[k]``, so only a run that writes them can match."""
        for replicas, home in zip(self.slots, homes):
            for t in replicas[home].captured.output_tensors():
                t.fill_(0)

    def differing(self, homes: list[str]) -> dict[int, int]:
        """Elements of slot k's outputs at ``homes[k]`` that differ from its reference, for the
        slots where any does."""
        wrong = {k: differing_elements(self.references[k][home], replicas[home].captured.output_tensors())
                 for k, (replicas, home) in enumerate(zip(self.slots, homes))}
        return {k: n for k, n in wrong.items() if n}

    def gate(self, built: Built, homes: list[str], stream: torch.cuda.Stream) -> str:
        """Run ``built`` once from the captured state, outputs zeroed: :data:`IDENTICAL` when every
        slot's outputs equal its own single-device replay bit for bit, else what differs."""
        self.reset()
        self.clear_outputs(homes)
        run(built, stream.cuda_stream)
        stream.synchronize()
        wrong = self.differing(homes)
        return verdict(wrong)


def verdict(wrong: dict[int, int]) -> str:
    """The gate's answer given the differing elements of each slot that has any."""
    return f"outputs differ from the single-device run (slot: elements) {wrong}" if wrong else IDENTICAL
