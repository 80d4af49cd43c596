"""What ``kernelfleet run`` does: one plan of a step, run the way the product runs it (runs on GPUs).

Capture a replica of the step on every device, check the plan against the captured step
(``runtime/plans.py``: launch count, device names, pins, memory), gate it (``runtime/gate.py``:
outputs bit-identical to the home device's own replay, or within its tolerance where the devices
captured different kernels) and, only if it passes, time it: the
median of ``repeats`` launches of its graph. The CLI parses and prints; this returns the figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.model import SLOT_MODES, Plan
from kernelfleet.plan.slots import estimate, uniform_link
from kernelfleet.profile.devices import ProfileSpec
from kernelfleet.profile.timing import median_seconds
from kernelfleet.runtime import plans
from kernelfleet.runtime.executor import release, run
from kernelfleet.runtime.gate import Gate, passed

if TYPE_CHECKING:
    from kernelfleet.workloads.steps import Step


@dataclass(frozen=True, slots=True)
class Ran:
    """A plan's run: the gate's verdict and, where it passed, the median seconds of its graph of
    ``slots`` requests in flight, laid out in ``slot_mode``."""

    policy: str
    home: str
    gate: str
    seconds: float | None
    copies: int
    copy_bytes: int
    slots: int = 1
    slot_mode: str = "sequential"


def run_shape(plan: Plan, slots: int | None, slot_mode: str | None, costs: CostTable | None) -> tuple[int, str]:
    """Requests in flight and slot mode to run ``plan`` with: as given, else the plan's own (the
    requests its throughput policy was made for, ``details.in_flight``, and its ``slot_mode``);
    UsageError for a count below 1, an unknown mode, or scheduled slots without a cost table."""
    k = slots if slots is not None else (plan.details.in_flight.requests if plan.details.in_flight else 1)
    mode = plan.slot_mode if slot_mode is None else slot_mode
    if k < 1:
        raise UsageError(f"--slots must be at least 1, got {k}")
    if mode not in SLOT_MODES:
        raise UsageError(f"--slot-mode {mode!r}: expected one of {', '.join(SLOT_MODES)}")
    if mode == "scheduled" and k > 1 and costs is None:
        raise UsageError("scheduled slots order each device's nodes by their estimated seconds: give --costs")
    return k, mode


def run_plan(make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], plan: Plan, where: str,
             repeats: int, costs: CostTable | None = None, slots: int | None = None,
             slot_mode: str | None = None) -> Ran:
    """Capture, validate (UsageError naming ``where``, the plan's file), gate and time ``plan`` on
    ``profiles`` (the devices by the names the plan uses, the first its default home), with
    ``slots`` requests in flight in ``slot_mode`` (:func:`run_shape`)."""
    k, mode = run_shape(plan, slots, slot_mode, costs)
    gate = Gate(make_step, profiles, k, costs)
    plan = plans.checked(gate.problem, plan, where)
    home = plan.details.home or gate.problem.home
    stream = torch.cuda.Stream(device=profiles[home].device)  # the home device's: the executor launches there
    seconds_of = estimate(costs, uniform_link(COPY_US, LINK_GBPS)) if mode == "scheduled" and k > 1 else None
    with gate:
        built = gate.graph(plan.policy, [plan.assignment] * k, [home] * k, slot_mode=mode if k > 1 else "sequential",
                           seconds=seconds_of)
        try:
            verdict = gate.gate(built, [home] * k, stream)
            seconds = None
            if passed(verdict):  # a plan failing the gate is never timed
                seconds = median_seconds(lambda: run(built, stream.cuda_stream), stream, repeats)
            return Ran(plan.policy, home, verdict, seconds, len(built.copies), built.copy_bytes, k, mode)
        finally:
            release(built)
