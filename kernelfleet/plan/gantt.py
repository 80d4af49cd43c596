"""A Gantt chart of one request under a plan, from the validator's list schedule.

One row per device with a box per launch, coloured by kernel kind (``graph.deps.kernel_kind``),
and one row per link carrying that link's transfers. The times are those of
``validate.schedule`` (the latency evaluation), so the chart shows exactly what the table's
latency column measured. A request-distribution plan is drawn as the replica an idle fleet
routes a request to, its fastest device. matplotlib is imported only when drawing.
"""

from __future__ import annotations

from pathlib import Path

from kernelfleet.errors import EnvironmentProblem
from kernelfleet.graph.deps import kernel_kind
from kernelfleet.plan.model import Plan, Problem
from kernelfleet.plan.validate import Schedule, check, schedule

COLOURS = {"tensor-core": "#4C72B0", "memory-bound": "#DD8452", "other": "#55A868", "transfer": "#8172B3"}


def plan_schedule(problem: Problem, plan: Plan) -> Schedule:
    """The list schedule of one request under ``plan`` (checked first)."""
    check(problem, plan)
    assignment = plan.assignment
    if plan.policy == "replicas":
        n = len(problem.program.launches)
        alone = {d: sum(problem.cost(k, d) or 0.0 for k in range(n)) for d in plan.details.replicas or ()}
        assignment = [min(alone, key=lambda d: alone[d])] * n
    return schedule(problem, assignment)


def draw(problem: Problem, plan: Plan, path: str | Path, *, title: str | None = None) -> Path:
    """Write the chart as PNG to ``path``; returns the path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise EnvironmentProblem(
            "drawing a Gantt chart needs matplotlib: pip install 'kernelfleet[bench]'"
        ) from exc
    s = plan_schedule(problem, plan)
    span = s.makespan_seconds or 1.0
    scale, unit = (1e6, "µs") if span < 1e-3 else (1e3, "ms") if span < 1.0 else (1.0, "s")
    links = sorted({tuple(sorted((t.source, t.target))) for t in s.transfers})
    lanes = list(problem.names) + [f"{a} ↔ {b}" for a, b in links]
    fig = Figure(figsize=(12, 1.2 + 0.6 * len(lanes)), dpi=110)
    FigureCanvasAgg(fig)  # a canvas of its own: no pyplot, no global backend state
    ax = fig.add_subplot()
    for row, device in enumerate(problem.names):
        boxes: dict[str, list[tuple[float, float]]] = {}
        for k, (d, a, b) in enumerate(zip(s.device, s.start_seconds, s.end_seconds)):
            if d == device and b > a:
                boxes.setdefault(kernel_kind(problem.program.launches[k]), []).append(
                    (a * scale, (b - a) * scale)
                )
        for kind, spans in boxes.items():
            ax.broken_barh(
                spans, (row - 0.4, 0.8), facecolors=COLOURS[kind], edgecolor="white", linewidth=0.3
            )
    for i, (a, b) in enumerate(links):
        spans = [
            (t.start_seconds * scale, (t.end_seconds - t.start_seconds) * scale)
            for t in s.transfers
            if tuple(sorted((t.source, t.target))) == (a, b)
        ]
        # transfers are not serialised in the latency model, so boxes may overlap: draw them translucent
        ax.broken_barh(spans, (len(problem.names) + i - 0.3, 0.6), facecolors=COLOURS["transfer"], alpha=0.6)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlim(0, span * scale * 1.01)
    ax.set_xlabel(f"time in one request ({unit})")
    ax.set_title(title or f"{plan.policy}: latency {span * scale:.3g} {unit}")
    ax.legend(
        handles=[Patch(color=c, label=k) for k, c in COLOURS.items()],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize=8,
    )  # outside the axes: never over a box
    path = Path(path)
    fig.savefig(path, format="png", bbox_inches="tight")
    return path
