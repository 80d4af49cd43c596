"""The edge experiment as plain data: which plans it times, and what it records of each.

``python -m bench.edge_cost`` runs a step under plans that differ only in how many of its launches
sit on the second device, so that what a cross-device edge costs in a real step shows as the
measured time's excess over the model, plan after plan (``plan/edges.py`` fits it). The plans
(:func:`edge_plans`), each over the step's capture order, home on the first device:

* ``single:A`` / ``single:B``: no edge at all (the model's own error on the whole step);
* ``cut S``: the order cut into ``S`` contiguous segments taking turns, A, B, A, ... (``S - 1``
  switches, the layer pipeline's shape at ``S = 2``);
* ``spread K``: ``K`` single launches on B, evenly spaced, the rest on A (each one an excursion
  out and back: copies in, copies home, a fork and a join);
* each of those with copies, the same graph with every copy cut to (nearly) zero bytes
  (``EdgePlan.copy_cap_bytes``): the edges without their bytes. Such a graph computes wrong
  outputs by design, so it is timed only after its full twin passed the gate, and never reported as
  a strategy.

Pinned launches stay home; an op call that passes data through its own workspace moves whole
(``graph.deps.together``). :func:`record` makes the :class:`EdgePlan` of one graph: its counts and
the model's predictions beside the measured time (``bench.edge_cost`` on a GPU; on a CPU,
``bench.edge_cost --derive`` recasts the recorded run's one-slot and conservative rows, which the
placement table's chained rows do not include, as a fixture named derived).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any, ClassVar

from pydantic import Field

from kernelfleet.documents import Document, document, model, one_of
from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import together
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.contention import Contention, sharing, spans
from kernelfleet.plan.edges import EdgeCounts, counts
from kernelfleet.plan.schedule import Node
from kernelfleet.plan.slots import SlotNode

EDGE_RUN_FORMAT = 1
FAMILIES = ("single", "cut", "spread", "recorded")
CUTS = (2, 3, 5, 9, 17, 33)  # segments: 1, 2, 4, 8, 16, 32 switches between the devices
SPREADS = (1, 2, 4, 8, 16, 32)  # single launches on the second device
Seconds = Annotated[float, Field(gt=0, le=10)]


@model("edge plan")
class EdgePlan:
    """One graph of the experiment: its placement's family and launches on the second device, how
    its copies were cut (None: the plan's own bytes), what the gate said, the measured and predicted
    seconds of the whole graph (``slots`` requests) and its :class:`~kernelfleet.plan.edges.EdgeCounts`."""

    target: str
    name: str
    family: one_of("family", FAMILIES)  # type: ignore[valid-type]
    on_second: Annotated[int, Field(ge=0)]
    slots: Annotated[int, Field(ge=1)]
    slot_mode: str
    gate: str
    counts: EdgeCounts
    predicted_seconds: Seconds  # today's model: the flags' link, the table's graph, shared and free times
    predicted_link_seconds: Seconds | None = None  # the same with the measured link (None: none given)
    measured_seconds: Seconds | None = None  # None: failed the gate, or refused
    copy_cap_bytes: Annotated[int, Field(ge=0)] | None = None
    method: str | None = None  # how copies were made (runtime/link.METHODS)


@document("kernelfleet_edge_run", EDGE_RUN_FORMAT, "run of the edge experiment")
class EdgeRun(Document):
    """What ``python -m bench.edge_cost`` measured (``derived``: recast on a CPU from recorded rows
    of another run, not an edge experiment; ``source`` says which)."""

    plans: list[EdgePlan]
    source: str
    command: str = "unknown"
    derived: bool = False
    link_source: str | None = None  # the source of the link ``predicted_link_seconds`` were made with
    refused: list[str] = Field(default_factory=list)  # plans the replicas could not run: never timed
    DUMP: ClassVar[dict[str, Any]] = {"indent": 1}


def edge_plans(program: Program, first: str, second: str) -> list[tuple[str, str, list[str]]]:
    """(name, family, assignment) of every placement of the module docstring, pinned launches home,
    each op call that passes data through its workspace (``graph.deps.together``) where its first
    launch goes."""
    n = len(program.launches)
    if n < 2:
        raise UsageError(f"a step of {n} launch cannot be cut between two devices")
    lead = list(range(n))  # the launch whose place each launch takes
    pinned = {k for k, launch in enumerate(program.launches) if launch.pinned}
    for group in together(program):
        for k in group[1:]:
            lead[k] = group[0]
        if pinned.intersection(group):
            pinned.add(group[0])

    def placed(on_second: set[int]) -> list[str]:
        return [second if lead[k] in on_second and lead[k] not in pinned else first for k in range(n)]

    out = [(f"single:{first}", "single", [first] * n), (f"single:{second}", "single", [second] * n)]
    for s in (s for s in CUTS if s <= n):
        bounds = [round(j * n / s) for j in range(s + 1)]
        out.append((f"cut {s}", "cut", placed({k for j in range(1, s, 2) for k in range(bounds[j], bounds[j + 1])})))
    for m in (m for m in SPREADS if 2 * m <= n):
        out.append((f"spread {m}", "spread", placed({int((i + 0.5) * n / m) for i in range(m)})))
    return [x for x in out if x[1] == "single" or second in x[2]]  # a cut that pins leaves nothing moved out


def capped(seconds: Callable[[int, Node], float], cap: int | None) -> Callable[[int, Node], float]:
    """``seconds`` with every copy at most ``cap`` bytes (None: as it is)."""
    if cap is None:
        return seconds

    def cut(slot: int, n: Node) -> float:
        if n.copy is not None and n.copy.length_bytes > cap:
            n = replace(n, copy=replace(n.copy, length_bytes=cap))
        return seconds(slot, n)

    return cut


def record(combined: list[SlotNode], mode: str, today: tuple[Callable[[int, Node], float], Contention],
           link: tuple[Callable[[int, Node], float], Contention] | None, cap: int | None = None,
           **fields: Any) -> EdgePlan:
    """The :class:`EdgePlan` of the graph ``combined`` in slot ``mode``: its counts on today's
    predicted schedule, today's prediction and the measured link's (``today``, ``link``: each a
    node estimate ``seconds(slot, node)`` and its contention), copies cut to ``cap`` bytes where
    given; ``fields``: the rest of the record."""
    def predicted(model: tuple[Callable[[int, Node], float], Contention]) -> tuple[float, list[tuple[float, float]]]:
        seconds = capped(model[0], cap)
        found = spans(combined, lambda x: seconds(x.slot, x.node), model[1], mode)
        return max(end for _, end in found), found

    seconds_today, found = predicted(today)
    plan_counts = counts(combined, found, by_slot=sharing(today[1], mode))
    if cap is not None:  # the counts of the graph that ran: its bytes cut
        plan_counts = replace(plan_counts, copy_bytes=sum(min(cap, x.node.copy.length_bytes)
                                                          for x in combined if x.node.copy is not None))
    with_link = predicted(link)[0] if link is not None else None
    return EdgePlan(counts=plan_counts, predicted_seconds=seconds_today, predicted_link_seconds=with_link,
                    slot_mode=mode, copy_cap_bytes=cap, **fields)
