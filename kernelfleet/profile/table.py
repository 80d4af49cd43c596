"""Measured per-kernel times as a cost table, and the census of which device each kernel prefers.

:func:`cost_table` joins what a capture knows about each launch — useful FLOPs from its ATen op
(PyTorch's formulas, given to the op's tensor-core kernel, or its first kernel), bytes from its
exactly known accesses, the op's precision — with the seconds timed on each device profile.
Bytes count only accesses whose extent is exact (schema, graph-node, ptx-dynamic): a pointer
followed "to the end of its buffer" bounds what a kernel may touch, not what it moves.

:func:`preference` is the census Tessera reports (PAPERS.md, section B): the share of kernels,
and of time, that runs faster on the device that is slower overall; :func:`preference_by_class`
splits it by a class per launch (from hardware counters: ``profile/counters.py``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.catalog.model import PRECISIONS
from kernelfleet.costs.links import MeasuredLink, describe
from kernelfleet.costs.table import CostTable
from kernelfleet.documents import read_text
from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import kernel_kind
from kernelfleet.graph.units import UnitView
from kernelfleet.kernels.ir import Program
from kernelfleet.kernels.raw import RawCapture, program_nodes

EXACT = ("schema", "graph-node", "ptx-dynamic")


def launch_flops(raw: RawCapture, program: Program) -> tuple[list[int | None], list[str | None]]:
    """Useful FLOPs and precision per launch; None where the launch's op counts no FLOPs."""
    launch_of = {node: i for i, node in enumerate(program_nodes(raw))}
    flops: list[int | None] = [None] * len(program.launches)
    precision: list[str | None] = [None] * len(program.launches)
    for op in raw.ops:
        mine = [launch_of[n] for n in range(op.first, op.end) if n in launch_of]
        if not mine or op.flops <= 0:
            continue
        tensor = [i for i in mine if kernel_kind(program.launches[i]) == "tensor-core"]
        target = (tensor or mine)[0]
        flops[target] = (flops[target] or 0) + op.flops
        precision[target] = op.precision if op.precision in PRECISIONS else None
    return flops, precision


def launch_bytes(program: Program) -> list[int | None]:
    """Bytes each launch reads and writes, from its exactly known accesses; None if it has none."""
    out: list[int | None] = []
    for launch in program.launches:
        exact = [a for a in launch.accesses if a.source in EXACT]
        out.append(sum(a.length_bytes * (2 if a.mode == "readwrite" else 1) for a in exact) if exact else None)
    return out


@dataclass(frozen=True)
class StepTimes:
    """Seconds per copy of the whole step as one graph on each profile (``profile/steptime.py``):
    alone, its copies free, and while the other profiles of ``shared`` run theirs (empty: fewer
    than two profiles were timed together); and the links measured between those
    (``profile/linkcost.py``); where ``shared`` has two profiles, the two graphs launched together
    once (``together``). What ``CostTable`` keeps as ``graph_seconds``, ``graph_seconds_free``,
    ``graph_seconds_shared``, ``links`` and ``graph_seconds_together``. One profile's figures, and a
    merge of runs, keep no ``together``: it is of a pair timed in one run."""

    alone: dict[str, float]
    free: dict[str, float]
    shared: dict[str, float]
    links: list[MeasuredLink] = field(default_factory=list)
    together: float | None = None

    def of(self, name: str) -> StepTimes:
        """The figures of one profile only (what its own launch table keeps), its links with them."""
        return StepTimes(*({name: d[name]} if name in d else {} for d in (self.alone, self.free, self.shared)),
                         [link for link in self.links if name in (link.a, link.b)])

    @classmethod
    def of_table(cls, table: CostTable, device: str) -> StepTimes:
        """What a launch table (``kernelfleet profile``'s per-device ``launches.DEVICE.json``) measured
        of ``device``: older tables hold no graph, or the graph alone only, and no link."""
        kinds = [{device: v[device]} if device in (v := getattr(table, kind) or {}) else {}
                 for kind in ("graph_seconds", "graph_seconds_free", "graph_seconds_shared")]
        return cls(*kinds, list(table.links or ()))

    def joined(self, other: StepTimes) -> StepTimes:
        """Both runs' figures (a merge of profiles from separate runs): ``other``'s where both
        measured a device; a link measured twice (once in each end's table) is kept once."""
        links = list(self.links) + [x for x in other.links if not any(x.joins(y.a, y.b) for y in self.links)]
        return StepTimes({**self.alone, **other.alone}, {**self.free, **other.free}, {**self.shared, **other.shared},
                         links)


def cost_table(raw: RawCapture, program: Program, seconds: dict[str, list[float | None]], source: str,
               graphs: StepTimes | None = None) -> CostTable:
    """A cost table of ``program`` from per-profile seconds (``seconds[profile][launch]``, each
    :func:`steadied`) and, where measured, each profile's whole-step graph times (``graphs``)."""
    for name, values in seconds.items():
        if len(values) != len(program.launches):
            raise UsageError(f"profile {name}: {len(values)} times for a program of {len(program.launches)} launches")
    flops, precision = launch_flops(raw, program)
    kernels = kernel_shapes(program)
    steady = {name: steadied(values, kernels) for name, values in seconds.items()}
    rows = [{name: values[i] for name, (values, _) in steady.items()} for i in range(len(program.launches))]
    replaced = sum(n for _, n in steady.values())
    if replaced:
        source += f"; {replaced} launch times above {OUTLIER_FACTOR:g}x their kernel's median taken as it"
    return CostTable(rows, source, flops, launch_bytes(program), precision, **_graph_fields(graphs))


OUTLIER_FACTOR = 2.0


def kernel_shapes(program: Program) -> list[tuple]:
    """Each launch's kernel and launch shape: equal for a model's repeats of one launch in its layers."""
    return [(launch.kind, launch.name, launch.grid, launch.block, launch.shared_bytes) for launch in program.launches]


def steadied(seconds: list[float | None], kernels: list[Hashable]) -> tuple[list[float | None], int]:
    """``seconds`` with each launch timed above :data:`OUTLIER_FACTOR` times the median of the launches
    that run the same kernel on the same launch shape (``kernels``: equal keys, as from
    :func:`kernel_shapes`; groups of three or more, a model's repeated layers) taken as that median,
    and how many were. Timed alone, a launch of a few µs now and then takes several times its
    fellows' time (a profile of an H200 run timed 1.5-µs elementwise kernels at 8-12 µs, 25 launches
    in one table, while a re-run of the same step timed 2); scaled to the measured graph, such
    outliers move time between the segments a plan puts on each device. Real differences between
    layers (an MoE's routing) stay: only outliers move."""
    groups: dict[Hashable, list[int]] = {}
    for k, key in enumerate(kernels):
        groups.setdefault(key, []).append(k)
    out, replaced = list(seconds), 0
    for members in groups.values():
        times = [seconds[k] for k in members]
        if len(members) < 3 or any(t is None for t in times):
            continue
        median = statistics.median(times)
        for k in members:
            if seconds[k] > OUTLIER_FACTOR * median:
                out[k], replaced = median, replaced + 1
    return out, replaced


def unit_table(views: dict[str, UnitView], seconds: dict[str, list[float | None]], source: str,
               graphs: StepTimes | None = None) -> CostTable:
    """A cost table of the units of devices that captured different kernels (``graph/units.py``):
    on each device the sum of its own launches of each unit, timed on it (``seconds[device]``: every
    launch of that device's own capture), None where any of them cannot run there. FLOPs per unit
    are the home device's (the first view's): the same op calls, whichever kernels run them.
    ``graphs``: each device's whole step as one graph, where measured; every launch is in one unit,
    so a unit column sums to its launches and scales by the same factor."""
    for name, view in views.items():
        if len(seconds[name]) != sum(map(len, view.launches)):
            raise UsageError(f"device {name}: {len(seconds[name])} times for {sum(map(len, view.launches))} launches")
    rows = []
    for u in range(len(next(iter(views.values())).ops)):
        row: dict[str, float | None] = {}
        for name, view in views.items():
            times = [seconds[name][i] for i in view.launches[u]]
            row[name] = None if any(t is None for t in times) else sum(times)
        rows.append(row)
    home = next(iter(views.values()))
    flops: list[int | None] = [sum(op.flops for op in home.raw.ops[a:b]) or None for a, b in home.ops]
    return CostTable(rows, source, flops, **_graph_fields(graphs))


def _graph_fields(graphs: StepTimes | None) -> dict[str, Any]:
    """The cost table's fields of ``graphs`` (None where a kind was not measured)."""
    if graphs is None:
        return {}
    return {"graph_seconds": graphs.alone or None, "graph_seconds_shared": graphs.shared or None,
            "graph_seconds_free": graphs.free or None, "links": graphs.links or None,
            "graph_seconds_together": graphs.together}


def graph_note(costs: CostTable) -> str | None:
    """One line on each device's measured whole-step graph against its column, or None without any."""
    factors = costs.graph_factors()
    if not factors:
        return None
    shared, free = costs.shared_factors(), costs.free_speedups()
    return "whole-step graph: " + ", ".join(
        f"{d} {costs.graph_seconds[d] * 1e3:.3f} ms (x{f:.2f} its launches' sum"
        + (f"; x{shared[d]:.2f} with the others running" if d in shared else "")
        + (f"; free copies x{free[d]:.2f} the work per second" if d in free else "") + ")"
        for d, f in factors.items()) + together_note(costs) + "".join(f"; {describe(link)}"
                                                                     for link in costs.links or ())


def together_note(costs: CostTable) -> str:
    """What the two devices' graphs launched together once met, as the factor the predictions take."""
    if costs.graph_seconds_together is None:
        return ""
    used = costs.contention_factors()
    return (f"; together once {costs.graph_seconds_together * 1e3:.3f} ms, so the predictions share by "
            + ", ".join(f"{d} x{f:.2f}" for d, f in used.items()))


@dataclass(frozen=True, slots=True)
class Preference:
    weaker: str  # the device with the larger total time
    stronger: str
    weaker_total_seconds: float
    stronger_total_seconds: float
    kernels_faster_on_weaker: int
    kernels: int
    seconds_faster_on_weaker: float  # the stronger device's time of the kernels the weaker runs faster

    @property
    def share_of_kernels(self) -> float:
        return self.kernels_faster_on_weaker / self.kernels

    @property
    def share_of_time(self) -> float:
        return self.seconds_faster_on_weaker / self.stronger_total_seconds


def preference(costs: CostTable, a: str, b: str) -> Preference:
    """How many kernels (and how much time) run faster on the overall slower of ``a`` and ``b``."""
    pairs = [(row[a], row[b]) for row in costs.seconds if row.get(a) is not None and row.get(b) is not None]
    if not pairs:
        raise UsageError(f"no launch has times on both {a} and {b}")
    total_a, total_b = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    weaker, stronger = (a, b) if total_a >= total_b else (b, a)
    w, s = (0, 1) if weaker == a else (1, 0)
    faster = [p for p in pairs if p[w] < p[s]]
    return Preference(weaker, stronger, max(total_a, total_b), min(total_a, total_b), len(faster), len(pairs),
                      sum(p[s] for p in faster))


@dataclass(frozen=True, slots=True)
class ClassPreference:
    """One class of kernels in the census: its share of the time, and what of it the weaker device runs faster."""

    kind: str
    kernels: int
    stronger_seconds: float  # the class's time on the stronger device
    weaker_seconds: float
    kernels_faster_on_weaker: int
    seconds_faster_on_weaker: float  # the stronger device's time of those kernels

    def share_of_time(self, overall: Preference) -> float:
        return self.stronger_seconds / overall.stronger_total_seconds

    @property
    def share_faster_of_kernels(self) -> float:
        return self.kernels_faster_on_weaker / self.kernels

    @property
    def share_faster_of_time(self) -> float | None:
        return self.seconds_faster_on_weaker / self.stronger_seconds if self.stronger_seconds else None


def preference_by_class(costs: CostTable, a: str, b: str, kinds: list[str]) -> tuple[Preference, list[ClassPreference]]:
    """The census of :func:`preference`, split by ``kinds[launch]`` (e.g. ``profile.counters.launch_classes``).

    The weaker device is the overall one in every class, so the classes add up to the whole."""
    if len(kinds) != len(costs.seconds):
        raise UsageError(f"{len(kinds)} classes for a cost table of {len(costs.seconds)} launches")
    overall = preference(costs, a, b)
    w, s = overall.weaker, overall.stronger
    rows: dict[str, list[tuple[float, float]]] = {}
    for row, kind in zip(costs.seconds, kinds):
        if row.get(a) is not None and row.get(b) is not None:
            rows.setdefault(kind, []).append((row[w], row[s]))
    out = []
    for kind, pairs in rows.items():
        faster = [(tw, ts) for tw, ts in pairs if tw < ts]
        out.append(ClassPreference(kind, len(pairs), sum(p[1] for p in pairs), sum(p[0] for p in pairs), len(faster),
                                   sum(p[1] for p in faster)))
    return overall, sorted(out, key=lambda c: -c.stronger_seconds)


def load_seconds(path: Path) -> CostTable:
    """A cost table (``kernelfleet profile``'s costs.json) or the per-launch seconds of a
    ``bench/capture_run.py`` profile (``<step>.profile.json``) as one."""
    text = read_text(path)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{path}: not JSON ({exc})") from exc
    if isinstance(doc, dict) and "kernelfleet_costs" in doc:
        return CostTable.from_json(text, str(path))
    profiles = doc.get("profiles") if isinstance(doc, dict) else None
    if not isinstance(profiles, dict) or not profiles:
        raise UsageError(f"{path}: neither a cost table (kernelfleet_costs) nor a capture_run profile (profiles)")
    # a profile whose timing failed on the GPU has seconds null: it is left out
    seconds = {name: p["seconds"] for name, p in profiles.items() if isinstance(p, dict) and isinstance(p.get("seconds"), list)}
    lengths = {len(v) for v in seconds.values()}
    if len(lengths) != 1:
        raise UsageError(f"{path}: expected profiles with lists of seconds of one length, got "
                         f"{ {k: len(v) for k, v in seconds.items()} or 'none'}")
    n = lengths.pop()
    return CostTable([{name: v[i] for name, v in seconds.items()} for i in range(n)],
                     f"{doc.get('step', path.name)} ({path.name})")
