"""Seconds of each launch on each device, as a document (``kernelfleet_costs``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Annotated, Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from kernelfleet.catalog.model import PRECISIONS
from kernelfleet.costs.links import MeasuredLink
from kernelfleet.documents import Document, document, one_of

COSTS_FORMAT = 1


# One launch's time: no kernel of an inference step runs an hour; a larger figure is a corrupt table
# (and 1e30 s leaves the MILP's numerics nothing to place by).
LaunchSeconds = Annotated[float, Field(ge=0, le=3600)]
GraphSeconds = Annotated[float, Field(gt=0, le=3600)]  # one copy of the whole step as a graph
GRAPHS = ("graph_seconds", "graph_seconds_shared", "graph_seconds_free")


@document("kernelfleet_costs", COSTS_FORMAT, "cost table")
class CostTable(Document):
    """Seconds of each launch on each device: ``seconds[launch index][device name]``.

    ``None`` means the launch cannot run there (unsupported), never 0 (STYLE rule 5).
    The optional per-launch lists feed the roofline cost model (``costs/model.py``):
    ``flops`` (useful FLOPs of the launch), ``bytes`` (bytes it moves to and from device
    memory) and ``precision`` (a catalog precision name such as "bf16", "fp32"; None for
    work without a tensor precision). Each entry may be None (unknown); a list that is
    absent is None, as in older documents without these keys. Every list has one entry
    per launch.

    ``graph_seconds`` (optional, by device): the whole step replayed as one CUDA graph on that
    device, as ``kernelfleet profile`` measures it (``profile/steptime.py``). Each launch timed
    alone pays a fixed cost per launch that back-to-back kernels of one graph do not, so on steps
    of few-µs kernels a column's sum overstates the graph by up to 46 % (H200, 2026-12-01,
    docs/validation/place-h200-pairs.md); :meth:`calibrated` scales each column to its graph.

    Two more optional measurements by device, of the same graph (the step's ``copies`` back to back,
    per copy), each what a strategy meets that a graph alone on its device does not:

    * ``graph_seconds_shared``: the graph timed while every other device of the profile loops its
      own (on replicas of its own): two partitions of one GPU busy at once share its memory and L2,
      and request distribution ran 11-18 % slower than each device's graph alone predicts (H200,
      2026-12-01). :meth:`shared_factors` is it over ``graph_seconds``.
    * ``graph_seconds_free``: the copies as independent chains ("slots free": the GPU runs kernels
      of both at once on the one device, which helps steps of kernels too small to fill it).
      :meth:`free_speedups` is ``graph_seconds`` over it: how much more work per second the device
      does with ``copies`` chains in flight than with one.

    ``graph_seconds_together`` (optional, one figure): the two devices of ``graph_seconds_shared``
    running one copy each in one graph, launched together: request distribution's own graph. Looping
    the other's graph overstates what two such copies meet: on the H100 they ran 1.09-1.12x the
    slower device alone where the shared factors said 1.19-1.25 (docs/validation/place-h200-pairs.md).
    :meth:`contention_factors` scales the shared factors to it.

    ``links`` (optional): each pair of devices' link as measured on them (``costs/links.py``); the
    predictions take copies between a pair from it where it is there, else from the plan's
    ``--copy-us`` and ``--link-gbps``.
    """

    seconds: list[dict[str, LaunchSeconds | None]]
    source: str = "unknown"  # "measured on ...", "roofline model fitted on ...", "synthetic seed 3"
    flops: list[int | None] | None = None
    bytes: list[int | None] | None = None
    precision: list[one_of("precision", PRECISIONS) | None] | None = None  # type: ignore[valid-type]
    graph_seconds: dict[str, GraphSeconds] | None = None
    graph_seconds_shared: dict[str, GraphSeconds] | None = None
    graph_seconds_free: dict[str, GraphSeconds] | None = None
    graph_seconds_together: GraphSeconds | None = None
    links: list[MeasuredLink] | None = None
    DUMP: ClassVar[dict[str, Any]] = {"exclude_none": True}

    @field_validator("flops", "bytes")
    @classmethod
    def _counts(cls, values: list[int | None] | None, info: ValidationInfo) -> list[int | None] | None:
        for k, value in enumerate(values or ()):
            if value is not None and value < 0:
                raise ValueError(f"launch {k}: {info.field_name} must be a number >= 0 or null, got {value!r}")
        return values

    @model_validator(mode="after")
    def _lengths(self) -> CostTable:
        n = len(self.seconds)
        for name in ("flops", "bytes", "precision"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries, seconds has {n} rows")
        for name in GRAPHS:
            for device in getattr(self, name) or {}:
                if not any(row.get(device) for row in self.seconds):
                    raise ValueError(f"{name}: device {device!r} has no launch time in seconds")
                if name != "graph_seconds" and device not in (self.graph_seconds or {}):
                    raise ValueError(f"{name}: device {device!r} has no graph_seconds to compare it with")
        if self.graph_seconds_together is not None and len(self.graph_seconds_shared or {}) != 2:
            raise ValueError("graph_seconds_together: it is of the two devices of graph_seconds_shared, which has "
                             f"{len(self.graph_seconds_shared or {})}")
        devices = {d for row in self.seconds for d in row}
        for k, link in enumerate(self.links or ()):
            if not {link.a, link.b} & devices:  # a device's own launch table keeps its links to the others
                raise ValueError(f"links.{k}: {link.a}-{link.b} joins no device the table has a column for")
        return self

    def with_links(self, links: list[MeasuredLink]) -> CostTable:
        """The table with ``links`` (those joining two of its devices) in place of its own for the
        same pairs."""
        devices = {d for row in self.seconds for d in row}
        new = [link for link in links if {link.a, link.b} <= devices]
        kept = [old for old in self.links or () if not any(old.joins(x.a, x.b) for x in new)]
        return replace(self, links=kept + new or None)

    def calibrated(self) -> CostTable:
        """The table with each device's column scaled so that it sums to the device's measured
        ``graph_seconds`` (unchanged where a device has none, and so for older tables). One factor
        per device, not an overhead per launch: in the H200 run a per-unit overhead fitted the same
        single-device graphs but predicted fewer of the mixed plans within 10 % (the table in
        docs/validation/place-h200-pairs.md). The source says what was scaled, and by how much."""
        factors = {d: f for d, f in self.graph_factors().items() if abs(f - 1) > 1e-12}
        if not factors:  # nothing measured, or scaled already
            return self
        rows = [{d: (t * factors[d] if t is not None and d in factors else t) for d, t in row.items()}
                for row in self.seconds]
        said = ", ".join(f"{d} x{f:.3f}" for d, f in factors.items())
        return replace(self, seconds=rows,
                       source=f"{self.source}; scaled to the measured graph time ({said})")

    def graph_factors(self) -> dict[str, float]:
        """Measured graph seconds over the column's sum, for each device with ``graph_seconds``."""
        sums = {d: sum(row.get(d) or 0.0 for row in self.seconds) for d in self.graph_seconds or {}}
        return {d: self.graph_seconds[d] / total for d, total in sums.items() if total > 0}

    def shared_factors(self) -> dict[str, float]:
        """Each device's graph while the others run theirs over its graph alone (>= 1 but for noise)."""
        return {d: t / self.graph_seconds[d] for d, t in (self.graph_seconds_shared or {}).items()}

    def contention_factors(self) -> dict[str, float]:
        """The shared factors the predictions use: :meth:`shared_factors`, each one's excess over 1
        scaled by one ``k`` so that the model (``plan/contention.py``) predicts the measured
        ``graph_seconds_together``; as measured where that is not. With the faster device's graph
        ``g1`` and the slower's ``g2`` alone, the model predicts the two together as
        ``max(g1 f1, g2 + g1 (f2 - 1))`` (the slower device shares only while the faster runs): each
        term meets the measurement at its own ``k``, and the smaller is the one the model reaches first."""
        shared = self.shared_factors()
        if self.graph_seconds_together is None or len(shared) != 2:
            return shared
        fast, slow = sorted(shared, key=lambda d: self.graph_seconds[d])
        g1, g2, together = self.graph_seconds[fast], self.graph_seconds[slow], self.graph_seconds_together
        reach = [(together - g1) / (g1 * (shared[fast] - 1)) if shared[fast] > 1 else math.inf,
                 (together - g2) / (g1 * (shared[slow] - 1)) if shared[slow] > 1 else math.inf]
        k = max(0.0, min(reach))
        return shared if math.isinf(k) else {d: 1 + k * (f - 1) for d, f in shared.items()}

    def free_speedups(self) -> dict[str, float]:
        """Each device's work per second with its graph's copies as free chains over chained."""
        return {d: self.graph_seconds[d] / t for d, t in (self.graph_seconds_free or {}).items()}

    def restricted(self, devices: list[str]) -> CostTable:
        """The table of ``devices`` only (their columns and measurements, in that order)."""
        def kept(values: dict[str, float] | None) -> dict[str, float] | None:
            return None if values is None else {d: values[d] for d in devices if d in values} or None

        links = [link for link in self.links or () if {link.a, link.b} <= set(devices)] or None
        together = self.graph_seconds_together if set(self.graph_seconds_shared or ()) <= set(devices) else None
        return replace(self, seconds=[{d: row.get(d) for d in devices if d in row} for row in self.seconds],
                       links=links, graph_seconds_together=together,
                       **{name: kept(getattr(self, name)) for name in GRAPHS})

    def faster_than(self, ceiling: dict[str, float]) -> list[tuple[int, str, float]]:
        """(launch, device, FLOP/s) wherever a time implies more FLOP/s than ``ceiling[precision]``
        allows (e.g. the fastest dense peak of any GPU in the catalog): a time that cannot be right,
        such as a kernel that skipped its work when the profiler replayed it."""
        if self.flops is None or self.precision is None:
            return []
        out = []
        for k, (row, flops, precision) in enumerate(zip(self.seconds, self.flops, self.precision)):
            if not flops or precision not in ceiling:
                continue
            out += [(k, device, flops / t) for device, t in row.items() if t and flops / t > ceiling[precision]]
        return out

