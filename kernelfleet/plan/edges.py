"""A plan graph's cross-device edges, counted, and what each costs beyond the model, fitted.

On the H200 run of 2026-12-01 plans of 12-47 copies a request ran 10-21 % slower than predicted,
though a copy measured alone costs about 1 µs (docs/validation/place-h200-pairs.md, "Link
measured"). ``python -m bench.edge_cost`` times plans of one step that differ only in how many
launches sit on the second device; this module says what such a plan graph holds and fits the
part of its time the model misses to those counts:

* :func:`counts` of a graph laid out as ``slots.pipeline`` makes it, given the (start, end) of
  each node the model predicts (``contention.spans``): copies and their bytes; *waits* (a node
  that depends on a node of another stream: a copy on its writer, a kernel on the copy that brought
  its bytes); *forks* (nodes another stream waits for while their own stream goes on: a kernel
  whose bytes a copy takes, with a next kernel on its device); *joins* (nodes that wait for another
  stream and for their own stream's previous node); and along the predicted critical chain, its
  copies, its waits and its forks (a fork followed on the chain by its own stream's next node).
* :class:`EdgeFit`: seconds per count of one to three of those terms, fitted by plain least
  squares (no intercept: a plan without edges keeps its prediction) on the residuals ``measured -
  predicted`` of the experiment's plans (:func:`fit`). ``contention.predict`` adds
  :meth:`EdgeFit.seconds` of the graph's counts to its prediction where a fit is given (opt-in:
  without one every prediction stays what it was).
"""

from __future__ import annotations

from dataclasses import fields
from itertools import pairwise
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import numpy as np
from pydantic import Field, model_validator

from kernelfleet.documents import Document, document, model
from kernelfleet.errors import UsageError

if TYPE_CHECKING:  # slots.py imports contention.py, which imports this module
    from kernelfleet.plan.slots import SlotNode

EDGES_FORMAT = 1
Count = Annotated[int, Field(ge=0)]
# A cost per edge beyond 1 ms is no graph's: a corrupt fit. Negative is allowed: the model may
# overcharge an edge (the flags' 4 µs per copy, against ~1 µs measured).
EdgeSeconds = Annotated[float, Field(ge=-1e-3, le=1e-3)]


@model("edge counts", frozen=True)
class EdgeCounts:
    """What crosses devices in one plan graph (module docstring), over all its slots."""

    nodes: Count
    copies: Count
    copy_bytes: Count
    waits: Count
    forks: Count
    joins: Count
    critical_copies: Count
    critical_waits: Count
    critical_forks: Count

    def value(self, term: str) -> int:
        return getattr(self, term)


TERMS = tuple(f.name for f in fields(EdgeCounts) if f.name != "nodes")
LABELS = {"copies": "copy", "copy_bytes": "byte copied", "waits": "wait across streams", "forks": "fork",
          "joins": "join", "critical_copies": "copy on the critical chain",
          "critical_waits": "wait on the critical chain", "critical_forks": "fork on the critical chain"}
DEFAULT_TERMS = ("critical_copies", "waits", "forks")  # per copy on the critical chain, per wait, per fork


def _previous_on_stream(combined: list[SlotNode], by_slot: bool) -> list[int | None]:
    """Each node's predecessor on its stream (of its slot too, where ``by_slot``: free slots)."""
    last: dict[Any, int] = {}
    out: list[int | None] = []
    for k, x in enumerate(combined):
        key = (x.slot, x.node.stream) if by_slot else x.node.stream
        out.append(last.get(key))
        last[key] = k
    return out


def critical_chain(combined: list[SlotNode], spans: list[tuple[float, float]], by_slot: bool = False) -> list[int]:
    """The nodes of the predicted critical chain, first to last: from the node that ends last, back
    through whichever of its dependencies and its stream's previous node ended last (what held its
    start), to a node that waited for nothing."""
    if not combined:
        return []
    previous = _previous_on_stream(combined, by_slot)
    k = max(range(len(combined)), key=lambda i: spans[i][1])
    chain = [k]
    while True:
        before = [*combined[k].deps, *([previous[k]] if previous[k] is not None else [])]
        if not before:
            break
        k = max(before, key=lambda i: (spans[i][1], i))
        chain.append(k)
    return chain[::-1]


def counts(combined: list[SlotNode], spans: list[tuple[float, float]], by_slot: bool = False) -> EdgeCounts:
    """The :class:`EdgeCounts` of ``combined`` with the model's ``spans`` of its nodes (module
    docstring); ``by_slot``: streams are per slot (free slots), for the critical chain."""
    other = [[d for d in x.deps if combined[d].node.stream != x.node.stream] for x in combined]
    previous = _previous_on_stream(combined, by_slot)
    going_on = {p for p in previous if p is not None}
    forking = {d for ds in other for d in ds if d in going_on}
    chain = critical_chain(combined, spans, by_slot)
    steps = list(pairwise(chain))
    crossing = sum(combined[a].node.stream != combined[b].node.stream for a, b in steps)
    forked = sum(a in forking and combined[a].node.stream == combined[b].node.stream for a, b in steps)
    copies = [x for x in combined if x.node.copy is not None]
    return EdgeCounts(len(combined), len(copies), sum(x.node.copy.length_bytes for x in copies),
                      sum(map(len, other)), len(forking),
                      sum(bool(ds) and p is not None for ds, p in zip(other, previous)),
                      sum(combined[k].node.copy is not None for k in chain), crossing, forked)


@model("edge fit term", frozen=True)
class Term:
    """Seconds each count of ``name`` (an :class:`EdgeCounts` field) adds to a plan graph."""

    name: str
    seconds: EdgeSeconds

    @model_validator(mode="after")
    def _known(self) -> Term:
        if self.name not in TERMS:
            raise ValueError(f"term must be one of {TERMS}, got {self.name!r}")
        return self


@document("kernelfleet_edges", EDGES_FORMAT, "per-edge fit")
class EdgeFit(Document):
    """Per-edge costs fitted on the residuals (measured - predicted) of ``plans`` plan graphs
    (:func:`fit`); ``fitted_on`` says which (an edge experiment, never the rows it is judged on)."""

    terms: list[Term]
    plans: Annotated[int, Field(ge=1)]
    rms_before_seconds: Annotated[float, Field(ge=0)]  # of the residuals before the fit
    rms_after_seconds: Annotated[float, Field(ge=0)]
    fitted_on: str = "unknown"
    DUMP: ClassVar[dict[str, Any]] = {"indent": 1}

    def seconds(self, found: EdgeCounts) -> float:
        """What the fit adds to a graph of ``found`` counts."""
        return sum(t.seconds * found.value(t.name) for t in self.terms)

    def describe(self) -> str:
        """One line: the terms and how much of the residual they take (not where it was fitted)."""
        said = ", ".join(f"{t.seconds * 1e6:+.3f} µs per {LABELS[t.name]}" for t in self.terms)
        return (f"{said} (least squares over {self.plans} plans, rms residual {self.rms_before_seconds * 1e6:.2f} -> "
                f"{self.rms_after_seconds * 1e6:.2f} µs)")


def fit(rows: list[tuple[EdgeCounts, float]], terms: tuple[str, ...] = DEFAULT_TERMS,
        fitted_on: str = "unknown") -> EdgeFit:
    """The least-squares :class:`EdgeFit` of ``terms`` to ``rows`` of (counts, residual seconds),
    without intercept. UsageError for an unknown term, fewer rows than terms, or terms the rows
    cannot tell apart (a term never nonzero, or two that move together)."""
    unknown = [t for t in terms if t not in TERMS]
    if unknown or not 1 <= len(terms) <= 3 or len(set(terms)) != len(terms):
        raise UsageError(f"give 1-3 different terms of {', '.join(TERMS)}, got {', '.join(terms) or 'none'}")
    if len(rows) < len(terms):
        raise UsageError(f"{len(rows)} plans cannot fit {len(terms)} terms")
    x = np.array([[float(c.value(t)) for t in terms] for c, _ in rows])
    y = np.array([r for _, r in rows])
    if np.linalg.matrix_rank(x) < len(terms):
        raise UsageError(f"the plans cannot tell the terms {', '.join(terms)} apart (a term is never nonzero or "
                         "two move together): fit fewer terms")
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    rms = [float(np.sqrt(np.mean(values ** 2))) for values in (y, y - x @ beta)]
    return EdgeFit([Term(t, float(b)) for t, b in zip(terms, beta)], len(rows), rms[0], rms[1], fitted_on)
