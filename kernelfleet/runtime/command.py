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
from kernelfleet.plan.model import Plan
from kernelfleet.profile.devices import ProfileSpec
from kernelfleet.profile.timing import median_seconds
from kernelfleet.runtime import plans
from kernelfleet.runtime.executor import release, run
from kernelfleet.runtime.gate import Gate, passed

if TYPE_CHECKING:
    from kernelfleet.workloads.steps import Step


@dataclass(frozen=True, slots=True)
class Ran:
    """A plan's run: the gate's verdict and, where it passed, the median seconds per step."""

    policy: str
    home: str
    gate: str
    seconds: float | None
    copies: int
    copy_bytes: int


def run_plan(make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], plan: Plan, where: str,
             repeats: int, costs: CostTable | None = None) -> Ran:
    """Capture, validate (UsageError naming ``where``, the plan's file), gate and time ``plan`` on
    ``profiles`` (the devices by the names the plan uses, the first its default home)."""
    gate = Gate(make_step, profiles, 1, costs)
    plan = plans.checked(gate.problem, plan, where)
    home = plan.details.home or gate.problem.home
    stream = torch.cuda.Stream(device=profiles[home].device)  # the home device's: the executor launches there
    with gate:
        built = gate.graph(plan.policy, [plan.assignment], [home])
        try:
            verdict = gate.gate(built, [home], stream)
            seconds = None
            if passed(verdict):  # a plan failing the gate is never timed
                seconds = median_seconds(lambda: run(built, stream.cuda_stream), stream, repeats)
            return Ran(plan.policy, home, verdict, seconds, len(built.copies), built.copy_bytes)
        finally:
            release(built)
