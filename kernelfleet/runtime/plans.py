"""Plans as the runtime takes them: through the validator, before anything is built.

STYLE (torchtitan): a plan is data, checked on the CPU, and the runtime trusts only validated
plans. So every plan file the runtime reads and every slot the executor builds passes
:func:`kernelfleet.plan.validate.check` — launch count, device names, pins, memory — against
:func:`problem`, the Problem of the step as the runtime captured it. A plan that fails says which
file (or strategy) and why, in one line.

The runtime's Problem holds the captured step, the devices under the names the plans give them
with the memory of their GPUs, and which launches each device can run: the cost table's answer
where the table the plans were made from is given, else every launch on every device, since each
device captured the whole step (a Problem without a cost table: ``Problem.cost`` then refuses,
so nothing is timed from it). It knows no link speeds either: each is infinite, never used.
Pure: no torch, so plans are checked on any machine.
"""

from __future__ import annotations

import math
from pathlib import Path

from kernelfleet.costs.table import CostTable
from kernelfleet.documents import read_text
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.model import PLANNED_PROGRAM, Device, Link, Plan, Problem
from kernelfleet.plan.validate import check

UNKNOWN_BYTES_PER_SECOND = math.inf  # a link the runtime has not measured


def problem(program: Program, devices: list[Device], costs: CostTable | None = None) -> Problem:
    """The Problem plans are checked against at run time (module docstring): ``program`` as the
    home device captured it, ``devices`` with their memory, first the default home; ``costs`` the
    table the plans were made from, or None."""
    names = [d.name for d in devices]
    if costs is None:
        pass  # every device captured the whole step: each can run every launch (Problem, costs=None)
    elif len(costs.seconds) != len(program.launches):
        raise UsageError(f"the cost table has {len(costs.seconds)} launches, the captured step "
                         f"{len(program.launches)}: it was made for another program")
    else:  # the table may time more profiles than the run has (e.g. the whole GPU)
        costs = CostTable([{d: row[d] for d in names if d in row} for row in costs.seconds], costs.source,
                          costs.flops, costs.bytes, costs.precision)
    links = [Link(a, b, UNKNOWN_BYTES_PER_SECOND) for i, a in enumerate(names) for b in names[i + 1:]]
    return Problem(program, devices, links, costs)


def read(path: Path) -> Plan:
    """The plan in ``path``, parsed (not yet checked against a step); UsageError naming the file."""
    return Plan.from_json(read_text(path, "a plan"), str(path))


def checked(problem: Problem, plan: Plan, where: str) -> Plan:
    """``plan`` once the validator passed it; else UsageError ``where: invalid ... plan: why``."""
    try:
        check(problem, plan)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return plan


def plan_files(folder: Path) -> list[Path]:
    """A plan folder's plan files: every ``*.json`` but the program they place (``PLANNED_PROGRAM``,
    which ``kernelfleet plan --policy all --out`` writes beside them), sorted."""
    return [p for p in sorted(folder.glob("*.json")) if p.name != PLANNED_PROGRAM]


def load(path: Path, problem: Problem) -> dict[str, Plan]:
    """The plans of ``path`` — a plan file, or a folder whose every ``*.json`` but the program they
    place (``PLANNED_PROGRAM``) is one — by policy, each checked against ``problem``. A folder's
    request-distribution plans (no assignment) are left out: a benchmark measures request
    distribution as a strategy of its own."""
    if path.is_dir():
        found = [(p, read(p)) for p in plan_files(path)]
        found = [(p, plan) for p, plan in found if plan.assignment]
    elif path.is_file():
        found = [(path, read(path))]
    else:
        raise UsageError(f"{path}: no such plan file or folder")
    return {plan.policy: checked(problem, plan, str(p)) for p, plan in found}


def check_slots(problem: Problem, name: str, assignments: list[list[str]], homes: list[str]) -> None:
    """Every slot of a strategy — where each launch runs, and its home — through the validator:
    what the executor builds has passed it, however the strategy was made (a plan file, a single
    device, request distribution's split)."""
    if len(assignments) != len(homes):
        raise UsageError(f"{name}: {len(assignments)} slot placements for {len(homes)} homes")
    seen: set[tuple[tuple[str, ...], str]] = set()
    for k, (assignment, home) in enumerate(zip(assignments, homes)):
        if (tuple(assignment), home) in seen:
            continue
        seen.add((tuple(assignment), home))
        # one slot's placement, not a planner's answer: the validator reads no objective, and the
        # policy is not the strategy's name, which could be one the validator reads otherwise ("replicas")
        checked(problem, Plan("slot", list(assignment), 0.0, details={"home": home}), f"{name}, slot {k}")
