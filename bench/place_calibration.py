"""Corrections of the cost table against the recorded H200 run, fitted only on single devices
(``python -m bench.place_table --calibrated``).

A cost table times each launch alone; the run's single-device rows (``single:a``, ``single:b``:
the whole step as one graph on one partition) are what ``kernelfleet profile`` measures itself
(``profile/steptime.py``). Each correction is fitted on those two figures per (target, pair) and
nothing else, then every strategy's prediction (chained, free and scheduled slots) is recomputed
on the CPU as ``bench disagg`` computes it: the strategy's slots from ``bench.disagg.strategies``,
its graph from ``runtime.executor.plan_graph`` (pure), ``contention.predict`` over it in its slot
mode with the corrected costs and the plans' link (``uniform_link(COPY_US, LINK_GBPS)``). The mixed
strategies (request distribution and the four placements) are the evaluation: no correction saw
them. The counts within 10 % are of the chained rows (as before); free and scheduled rows are
counted apart.

Corrections:

* ``none``: the table as profiled (its recomputed predictions are the run's own, but for two rows:
  below);
* ``scale``: each device's column times its graph time over its sum (``CostTable.calibrated``);
* ``overhead``: each device's column less one fitted cost per launch (unit), (sum - graph) / n,
  floored at zero;
* ``contention``: ``scale``, and every strategy predicted by ``contention.predict`` with the cost
  table's shared and free graph times (``kernelfleet profile`` measures them since 2026-12-01):
  what ``bench disagg`` and ``kernelfleet plan`` now predict. A table without them (the committed
  run) predicts as ``scale``.

The graph times come from the cost table where ``kernelfleet profile`` measured them, else from
the run's single-device rows (the committed run was profiled before profile measured graphs).

Beside each correction's predictions stands its choice: the row it predicts fastest among every
plan and single device in every slot mode (``bench.choice``, what ``kernelfleet plan`` ranks), and
that row's measured time over the fastest measured row's (target: within 3 %).

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
from typing import Any

from kernelfleet.bench.choice import chosen
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.contention import Contention, predict
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.model import Device, Plan, Problem
from kernelfleet.plan.slots import estimate, uniform_link
from kernelfleet.profile.table import kernel_shapes, steadied
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.executor import plan_graph

CORRECTIONS = ("none", "scale", "overhead", "contention")
SINGLES = ("single:a", "single:b")
WITHIN, CHOSEN_WITHIN = 0.10, 0.03


def graph_seconds(found: dict) -> dict[str, float]:
    """Each device's measured seconds per slot of its single-device graph: what profile measures."""
    return {name.split(":")[1]: found[name]["seconds"] / found[name]["slots"] for name in SINGLES
            if found.get(name, {}).get("seconds")}


def with_graph(costs: CostTable, graph: dict[str, float]) -> CostTable:
    """``costs`` of the devices of ``graph`` only, their graph times ``graph`` (a run's own)."""
    return replace(costs.restricted(list(graph)), graph_seconds=graph)


def timed(found: dict) -> dict[str, float]:
    """Measured seconds per slot of every strategy that passed its gate, but for the paced links and
    the one-slot ablations (not strategies a server would run)."""
    return {name: r["seconds"] / r["slots"] for name, r in found.items() if r.get("seconds")
            and not name.startswith(("link ", "ablation")) and not name.endswith("1 slot")}


def corrected(costs: CostTable, graph: dict[str, float], how: str) -> CostTable:
    """``costs`` under correction ``how`` (module docstring), fitted on ``graph``."""
    if how == "none":
        return costs
    if how in ("scale", "contention"):
        return with_graph(costs, graph).calibrated()
    less = {d: (sum(r.get(d) or 0.0 for r in costs.seconds) - g) / len(costs.seconds) for d, g in graph.items()}
    rows = [{d: (max(0.0, t - less[d]) if t is not None and d in less else t) for d, t in row.items()}
            for row in costs.seconds]
    return replace(costs, seconds=rows)


def slot_strategies(folder: Path, costs: CostTable) -> tuple[Program, list, dict[str, str]]:
    """The folder's program, the strategies the run timed in a slot mode (chained, free, scheduled;
    not the ablations, paced links or one slot) that today's validator passes, and why it refuses
    the others, by name: a plan the product would no longer make or run (one that splits an op call
    passing data through its own workspace, say) is not predicted, whatever the run measured."""
    from kernelfleet.bench.disagg import strategies  # torch at import: only where predictions are made

    run = json.loads((folder / "disagg.json").read_text())
    found = run["strategies"]
    program = Program.load(folder / "program.json.gz")
    plans = {p.policy: p for p in (Plan.from_json(f.read_text(), str(f)) for f in folder.glob("plan.*.json"))
             if p.assignment}
    devices, slots, n = list(run["devices"]), run["slots"], len(program.launches)
    rates = {d: found[f"single:{d}"]["slots_per_second"] for d in devices}
    seconds = estimate(costs, uniform_link(COPY_US, LINK_GBPS))
    today = runtime_plans.problem(program, [Device(d) for d in devices])
    kept, refused = [], {}
    for s in strategies(plans, devices, slots, None, n) + strategies(plans, devices, slots, rates, n, seconds):
        if (set(s.options) - {"slot_mode", "seconds"} or len(s.assignments) != slots
                or not found.get(s.name, {}).get("seconds")):
            continue  # every slot, in a slot mode: no ablation, paced link or one slot
        why = refusal(today, s)
        if why is None:
            kept.append(s)
        else:
            refused[s.name] = why
    return program, kept, refused


def refusal(today: Problem, strategy: Any) -> str | None:
    """Why today's validator refuses a recorded strategy's slots (``bench.disagg.Strategy``), or None."""
    try:
        runtime_plans.check_slots(today, strategy.name, strategy.assignments, strategy.homes)
    except UsageError as exc:
        return str(exc)
    return None


def predictions(folder: Path, costs: CostTable, contention: Contention | None = None,
                strategies: tuple[Program, list, dict[str, str]] | None = None) -> dict[str, float]:
    """Seconds ``contention.predict`` gives each of :func:`slot_strategies` (``strategies``, where the
    caller has them already), from ``costs`` and ``contention`` (None: none, each device as if alone)."""
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    program, kept, _ = strategies or slot_strategies(folder, costs)
    # the run placed units (each device's nodes in capture order) where its captures differed; its
    # conservative ablation then predicts what its chained throughput plan does
    conservative = program.units and (found.get("ablation: slots chained, conservative", {}).get("predicted_seconds")
                                      == found.get("throughput-milp", {}).get("predicted_seconds"))
    seconds = estimate(costs, uniform_link(COPY_US, LINK_GBPS))
    out = {}
    for s in kept:
        mode = s.options.get("slot_mode", "sequential")
        _, combined = plan_graph([(program, a, h) for a, h in zip(s.assignments, s.homes)], not conservative,
                                 resident_state=True, slot_mode=mode, seconds=s.options.get("seconds"))
        out[s.name] = predict(combined, lambda x: seconds(x.slot, x.node), contention or Contention(), mode)
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
    errors: dict[str, dict[str, float]]  # correction -> chained strategy -> measured / predicted - 1
    chosen: dict[str, str]  # "recorded" and each correction -> the row it predicts fastest
    chosen_over_best: dict[str, float]  # its measured time over the fastest measured row's
    best: str  # the fastest measured row
    free_errors: dict[str, dict[str, float]]  # correction -> free and scheduled rows -> measured / predicted - 1


def profiled(folder: Path) -> CostTable:
    """The folder's cost table as ``kernelfleet profile`` makes it today: each column's timing
    outliers among launches of the same kernel and shape taken as their median
    (``profile.table.steadied``, since 2026-12-05; the recorded tables were written before). A table
    of units (devices that ran different kernels) sums each unit's launches, whose own times the
    folder does not keep: it stays as recorded."""
    costs = CostTable.from_json((folder / "costs.json").read_text(), str(folder / "costs.json"))
    program = Program.load(folder / "program.json.gz")
    if program.units:
        return costs
    kernels = kernel_shapes(program)
    columns = {d: steadied([row.get(d) for row in costs.seconds], kernels)[0]
               for d in sorted({d for row in costs.seconds for d in row})}
    return replace(costs, seconds=[{d: columns[d][k] for d in row} for k, row in enumerate(costs.seconds)])


def evaluate(folder: Path, costs: CostTable | None = None) -> Evaluation:
    """Every correction of one (target, pair) folder, against its measured strategies, from ``costs``
    (default: the table as profile makes it today, :func:`profiled`)."""
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    costs = profiled(folder) if costs is None else costs
    graph = costs.graph_seconds or graph_seconds(found)
    measured = timed(found)
    best = min(measured, key=measured.get)
    errors, free_errors = {}, {}
    picks = {"recorded": chosen(found)}
    for how in CORRECTIONS:
        table = corrected(costs, graph, how)
        predicted = predictions(folder, table, Contention.of(table) if how == "contention" else None)
        every = {name: found[name]["seconds"] / p - 1 for name, p in predicted.items()}
        errors[how] = {name: e for name, e in every.items() if ", slots" not in name}
        free_errors[how] = {name: e for name, e in every.items() if ", slots" in name}
        picks[how] = chosen({name: {**found[name], "predicted_seconds": p} for name, p in predicted.items()})
    names = list(errors["none"])
    mixed = [n for n in names if n not in SINGLES]
    target, _, pair = folder.name.rpartition(".")
    recorded = sum(abs(found[n]["seconds"] / found[n]["predicted_seconds"] - 1) <= WITHIN for n in names)
    return Evaluation(target, pair, recorded,
                      {h: sum(abs(e) <= WITHIN for e in errors[h].values()) for h in CORRECTIONS},
                      {h: sum(abs(errors[h][n]) <= WITHIN for n in mixed) for h in CORRECTIONS},
                      len(names), len(mixed), with_graph(costs, graph).graph_factors(), errors,
                      picks, {h: measured[p] / measured[best] for h, p in picks.items() if p}, best, free_errors)


def markdown(found: list[Evaluation]) -> str:
    head = ("| target | pair | scale a, b | within 10 %: recorded | " + " | ".join(CORRECTIONS)
            + " | mixed within 10 %: " + " | ".join(CORRECTIONS) + " | worst mixed, contention |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in found:
        mixed = {n: v for n, v in e.errors["contention"].items() if n not in SINGLES}
        worst = max(mixed, key=lambda n: abs(mixed[n]))
        lines.append(f"| {e.target} | {e.pair} | {', '.join(f'{f:.2f}' for f in e.factors.values())} "
                     f"| {e.recorded} of {e.rows} | " + " | ".join(str(e.within[h]) for h in CORRECTIONS)
                     + f" | {e.mixed_within['none']} of {e.mixed} | "
                     + " | ".join(str(e.mixed_within[h]) for h in CORRECTIONS[1:])
                     + f" | {worst} {mixed[worst]:+.1%} |")
    lines += ["", "| target | pair | best (measured) | chosen: recorded | scale | contention |", "|---|---|---|---|---|---|"]
    for e in found:
        lines.append(f"| {e.target} | {e.pair} | {e.best} | "
                     + " | ".join(f"{e.chosen[h]} {e.chosen_over_best[h]:.3f}" if e.chosen.get(h) else "-"
                                  for h in ("recorded", "scale", "contention")) + " |")
    return "\n".join(lines)


def totals(found: list[Evaluation]) -> dict[str, str]:
    """Rows within 10 % over the whole run, per correction: all chained rows and the mixed ones;
    free and scheduled rows; rows whose choice is within 3 % of the best."""
    rows, mixed = sum(e.rows for e in found), sum(e.mixed for e in found)
    free = sum(len(e.free_errors["none"]) for e in found)
    out = {"recorded predictions": f"{sum(e.recorded for e in found)} of {rows} chained rows"}
    for h in CORRECTIONS:
        out[h] = (f"{sum(e.within[h] for e in found)} of {rows} chained rows, "
                  f"{sum(e.mixed_within[h] for e in found)} of {mixed} mixed")
    for h in CORRECTIONS:
        out[f"free and scheduled rows within 10 %, {h}"] = (
            f"{sum(abs(v) <= WITHIN for e in found for v in e.free_errors[h].values())} of {free}")
    for h in ("recorded", *CORRECTIONS):
        out[f"chosen within 3 % of the best, {h}"] = (
            f"{sum(e.chosen_over_best.get(h, float('inf')) <= 1 + CHOSEN_WITHIN for e in found)} of {len(found)} rows")
    return out
