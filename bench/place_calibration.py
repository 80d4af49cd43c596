"""Corrections of the cost table against the recorded H200 run, fitted only on single devices
(``python -m bench.place_table --calibrated``).

A cost table times each launch alone; the run's single-device rows (``single:a``, ``single:b``:
the whole step as one graph on one partition) are what ``kernelfleet profile`` measures itself
(``profile/steptime.py``). Each correction is fitted on those two figures per (target, pair) and
nothing else, then every chained strategy's prediction is recomputed on the CPU as ``bench
disagg`` computes it: the strategy's slots from ``bench.disagg.strategies``, its graph from
``runtime.executor.plan_graph`` (pure), ``slots.makespan`` over it with the corrected costs and the
plans' link (``uniform_link(COPY_US, LINK_GBPS)``). The mixed strategies (request distribution and
the four placements) are the evaluation: no correction saw them.

Corrections:

* ``none``: the table as profiled (its recomputed predictions are the run's own, but for two rows:
  below);
* ``scale``: each device's column times its graph time over its sum (``CostTable.calibrated``);
* ``overhead``: each device's column less one fitted cost per launch (unit), (sum - graph) / n,
  floored at zero.

The recomputation repeats the run's ``predicted_seconds`` on 90 of 92 rows to the last digit. The
two others are mamba-decode's on the different-kernel pair (pipeline 283.9 µs against 279.9
recorded, throughput plan exact): the run found both devices' captures identical (mamba calls no
attention) and placed launches, while the folder keeps the profile's unit program, whose accesses
differ slightly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.model import Plan
from kernelfleet.plan.slots import estimate, makespan, uniform_link
from kernelfleet.runtime.executor import plan_graph

CORRECTIONS = ("none", "scale", "overhead")
SINGLES = ("single:a", "single:b")
WITHIN = 0.10


def graph_seconds(found: dict) -> dict[str, float]:
    """Each device's measured seconds per slot of its single-device graph: what profile measures."""
    return {name.split(":")[1]: found[name]["seconds"] / found[name]["slots"] for name in SINGLES
            if found.get(name, {}).get("seconds")}


def corrected(costs: CostTable, graph: dict[str, float], how: str) -> CostTable:
    """``costs`` under correction ``how`` (module docstring), fitted on ``graph``."""
    if how == "none":
        return costs
    if how == "scale":
        return replace(costs, graph_seconds=graph).calibrated()
    less = {d: (sum(r.get(d) or 0.0 for r in costs.seconds) - g) / len(costs.seconds) for d, g in graph.items()}
    rows = [{d: (max(0.0, t - less[d]) if t is not None and d in less else t) for d, t in row.items()}
            for row in costs.seconds]
    return replace(costs, seconds=rows)


def predictions(folder: Path, costs: CostTable) -> dict[str, float]:
    """Seconds ``slots.makespan`` predicts for each chained strategy the run timed, from ``costs``."""
    from kernelfleet.bench.disagg import strategies  # torch at import: only where predictions are made

    run = json.loads((folder / "disagg.json").read_text())
    found = run["strategies"]
    program = Program.load(folder / "program.json.gz")
    plans = {p.policy: p for p in (Plan.from_json(f.read_text(), str(f)) for f in folder.glob("plan.*.json"))
             if p.assignment}
    devices, slots, n = list(run["devices"]), run["slots"], len(program.launches)
    rates = {d: found[f"single:{d}"]["slots_per_second"] for d in devices}
    # the run placed units (each device's nodes in capture order) where its captures differed; its
    # conservative ablation then predicts what its chained throughput plan does
    conservative = program.units and (found.get("ablation: slots chained, conservative", {}).get("predicted_seconds")
                                      == found.get("throughput-milp", {}).get("predicted_seconds"))
    seconds = estimate(costs, uniform_link(COPY_US, LINK_GBPS))
    out = {}
    for s in strategies(plans, devices, slots, None, n) + strategies(plans, devices, slots, rates, n):
        if s.options or len(s.assignments) != slots or not found.get(s.name, {}).get("seconds"):
            continue  # chained rows of every slot only, as the table's predictions
        _, combined = plan_graph([(program, a, h) for a, h in zip(s.assignments, s.homes)], not conservative,
                                 resident_state=True)
        out[s.name] = makespan(combined, lambda x: seconds(x.slot, x.node))
    return out


@dataclass(frozen=True)
class Evaluation:
    target: str
    pair: str
    recorded: int  # chained rows within WITHIN of the run's own predicted_seconds
    within: dict[str, int]  # correction -> chained rows within WITHIN of its recomputed prediction
    mixed_within: dict[str, int]  # the same over the mixed strategies only (no single device)
    rows: int
    mixed: int
    factors: dict[str, float]  # scale: graph / column sum, per device
    errors: dict[str, dict[str, float]]  # correction -> strategy -> measured / predicted - 1


def evaluate(folder: Path) -> Evaluation:
    """Every correction of one (target, pair) folder, against its measured chained strategies."""
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    costs = CostTable.from_json((folder / "costs.json").read_text(), str(folder / "costs.json"))
    graph = graph_seconds(found)
    errors = {}
    for how in CORRECTIONS:
        predicted = predictions(folder, corrected(costs, graph, how))
        errors[how] = {name: found[name]["seconds"] / p - 1 for name, p in predicted.items()}
    names = list(errors["none"])
    mixed = [n for n in names if n not in SINGLES]
    target, _, pair = folder.name.rpartition(".")
    recorded = sum(abs(found[n]["seconds"] / found[n]["predicted_seconds"] - 1) <= WITHIN for n in names)
    return Evaluation(target, pair, recorded,
                      {h: sum(abs(e) <= WITHIN for e in errors[h].values()) for h in CORRECTIONS},
                      {h: sum(abs(errors[h][n]) <= WITHIN for n in mixed) for h in CORRECTIONS},
                      len(names), len(mixed), replace(costs, graph_seconds=graph).graph_factors(), errors)


def markdown(found: list[Evaluation]) -> str:
    head = ("| target | pair | scale a, b | within 10 %: recorded | none | scale | overhead "
            "| mixed within 10 %: none | scale | overhead | worst mixed, scale |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in found:
        mixed = {n: v for n, v in e.errors["scale"].items() if n not in SINGLES}
        worst = max(mixed, key=lambda n: abs(mixed[n]))
        lines.append(f"| {e.target} | {e.pair} | {', '.join(f'{f:.2f}' for f in e.factors.values())} "
                     f"| {e.recorded} of {e.rows} | " + " | ".join(str(e.within[h]) for h in CORRECTIONS)
                     + f" | {e.mixed_within['none']} of {e.mixed} | {e.mixed_within['scale']} "
                     f"| {e.mixed_within['overhead']} | {worst} {mixed[worst]:+.1%} |")
    return "\n".join(lines)


def totals(found: list[Evaluation]) -> dict[str, str]:
    """Rows within 10 % over the whole run, per correction: all chained rows and the mixed ones."""
    rows, mixed = sum(e.rows for e in found), sum(e.mixed for e in found)
    out = {"recorded predictions": f"{sum(e.recorded for e in found)} of {rows} chained rows"}
    for h in CORRECTIONS:
        out[h] = (f"{sum(e.within[h] for e in found)} of {rows} chained rows, "
                  f"{sum(e.mixed_within[h] for e in found)} of {mixed} mixed")
    return out
