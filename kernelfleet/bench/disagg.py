"""``kernelfleet bench disagg``: every placement strategy for one step on the emulated
complementary pair, measured in one run, each behind the correctness gate (runs on GPUs).

The two devices are device profiles (``profile/devices.py``) named as the plans name them —
on two H200s, "compute" (56 SMs + a 64-SM copy hog, L40S-like) on one GPU and "bandwidth" (32 SMs,
A100-like) on the other. Every strategy runs ``slots`` micro-batches of the step, each slot with
replicas of its own, as one CUDA graph (``runtime/executor.py``); its time is the median of
``repeats`` graph launches and its rate is slots per second. Strategies:

* ``single:<device>``: every slot whole on one device, chained and (once the rates are known) free;
* ``replicas`` (request distribution): each slot whole on one device, slots split between the
  devices in proportion to their measured single-device rates;
* every plan of the folder ``kernelfleet plan --policy all --out PLANS`` wrote (the throughput
  MILP, layer pipeline, attention/FFN split, latency plan), all slots under it;
* the throughput plan, the layer pipeline and request distribution with the slots free (a device
  runs kernels of several slots at once) as well as chained (each device runs slot after slot);
* the pipelining ablation on the throughput plan: one slot with the conservative schedule (nothing
  overlaps), chained slots with the conservative schedule, chained slots with the overlapping
  schedule (the plan's own row), free slots, and free slots with priorities to earlier slots;
* link sensitivity: the throughput plan, slots free, with every copy paced to 200, 100 and 25 Gbit/s;
* given the cost table the plans were made from (``--costs``): the throughput plan and the layer
  pipeline with list-scheduled slots (``plan/slots.py``), and beside every strategy the graph
  time ``contention.predict`` predicts in its slot mode (the prediction ``kernelfleet plan``
  ranks plans by: with the cost table's shared and free graph times where it has them).

Before a strategy is timed, every slot of it passes the validator (``runtime/plans.py``), the
executor checks its plan graph has no race (``schedule.races``) and the GPU runs it once from the
captured state: each slot's outputs must equal, bit for bit, its own capture's graph replay (the
gate, ``runtime/gate.py``). A strategy failing any is reported, never timed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table

from kernelfleet.bench.choice import candidates, chosen
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.plan.contention import Contention, predict
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.model import Plan
from kernelfleet.plan.schedule import Node
from kernelfleet.plan.slots import SlotNode, estimate, uniform_link
from kernelfleet.profile.devices import ProfileSpec
from kernelfleet.profile.timing import median_seconds
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.executor import release, run
from kernelfleet.runtime.gate import Gate, passed
from kernelfleet.runtime.link import Throttle
from kernelfleet.workloads.steps import Step

LINKS_GBIT = (200, 100, 25)


@dataclass
class Strategy:
    """A row of the benchmark: each slot's placement and home (checked by the validator when the
    gate builds it), the executor's options, and the planner's own time where a plan gives one."""

    name: str
    assignments: list[list[str]]  # one per slot
    homes: list[str]
    options: dict = field(default_factory=dict)
    model_seconds: float | None = None  # the planner's time per request, where a plan gives one


def strategies(plans: dict[str, Plan], devices: list[str], slots: int, single_rates: dict[str, float] | None,
               n: int, seconds: Callable[[int, Node], float] | None = None) -> list[Strategy]:
    """The strategies of the module docstring; ``replicas`` once the single-device rates are known;
    list-scheduled slots where ``seconds`` estimates each node."""
    if single_rates is None:
        return [Strategy(f"single:{d}", [[d] * n] * slots, [d] * slots) for d in devices]
    total = sum(single_rates.values())
    on_first = min(slots - 1, max(1, round(slots * single_rates[devices[0]] / total)))
    split = [devices[0]] * on_first + [devices[1]] * (slots - on_first)
    free = {"slot_mode": "free"}
    out = [Strategy(f"single:{d}, slots free", [[d] * n] * slots, [d] * slots, free) for d in devices]
    out += [Strategy("replicas", [[d] * n for d in split], split),
            Strategy("replicas, slots free", [[d] * n for d in split], split, free)]
    for policy, plan in plans.items():
        if policy.startswith("single"):
            continue
        home, model = plan.details.home or devices[0], plan.objective_seconds
        out.append(Strategy(policy, [plan.assignment] * slots, [home] * slots, model_seconds=model))
        if policy in ("throughput-milp", "pipeline"):
            out.append(Strategy(f"{policy}, slots free", [plan.assignment] * slots, [home] * slots, free, model))
            out.append(Strategy(f"{policy}, 1 slot", [plan.assignment], [home], {}, model))
            if seconds is not None:
                out.append(Strategy(f"{policy}, slots scheduled", [plan.assignment] * slots, [home] * slots,
                                    {"slot_mode": "scheduled", "seconds": seconds}, model))
    best = plans.get("throughput-milp")
    if best is not None:
        home = best.details.home or devices[0]
        every = [best.assignment] * slots
        out.append(Strategy("ablation: 1 slot, conservative", [best.assignment], [home], {"overlap": False}))
        out.append(Strategy("ablation: slots chained, conservative", every, [home] * slots, {"overlap": False}))
        out.append(Strategy("ablation: slots free + priorities", every, [home] * slots,
                            {**free, "priorities": True}))
        for gbit in LINKS_GBIT:
            out.append(Strategy(f"link {gbit} Gbit/s, slots free", every, [home] * slots,
                                {**free, "throttle": Throttle(gbit * 1e9 / 8, 5e-6)}))
    return out


def prediction(combined: list[SlotNode], strategy: Strategy, seconds: Callable[[int, Node], float] | None,
               contention: Contention | None) -> float | None:
    """The graph's seconds as ``contention.predict`` predicts them in the strategy's slot mode, from
    ``seconds`` (an estimate of each node; None: no prediction) and ``contention`` (None: none)."""
    if seconds is None:
        return None
    return predict(combined, lambda x: seconds(x.slot, x.node), contention or Contention(),
                   strategy.options.get("slot_mode", "sequential"))


def measure(gate: Gate, strategy: Strategy, repeats: int, stream: torch.cuda.Stream,
            seconds: Callable[[int, Node], float] | None = None, contention: Contention | None = None) -> dict:
    """Gate the strategy's graph, then time it: the median of ``repeats`` launches on ``stream``;
    beside it the graph's time as ``contention.predict`` predicts it in the strategy's slot mode from
    ``seconds`` (an estimate of each node) and ``contention``, where given. A strategy failing the
    gate is reported, never timed."""
    built = gate.graph(strategy.name, strategy.assignments, strategy.homes, **strategy.options)
    predicted = prediction(built.combined, strategy, seconds, contention)
    try:
        verdict = gate.gate(built, strategy.homes, stream)
        if not passed(verdict):
            return {"gate": verdict}
        median = median_seconds(lambda: run(built, stream.cuda_stream), stream, repeats)
        return {"gate": verdict, "seconds": median, "predicted_seconds": predicted, "slots": built.slots,
                "slots_per_second": built.slots / median, "copies": len(built.copies),
                "copy_bytes": built.copy_bytes, "method": built.method}
    finally:
        release(built)


def disagg(make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], plans: Path, slots: int,
           repeats: int, out: Path, console: Console, costs: CostTable | None = None,
           link: Callable[[int, str, str], float] | None = None) -> dict:
    """Run every strategy (module docstring); write and return the results. ``costs``: the cost
    table the plans were made from, for list-scheduled slots and each graph's predicted time, with
    copies costed by ``link`` (the model the plans were made with)."""
    if slots < 2:
        raise UsageError(f"--slots must be at least 2 (request distribution needs one per device), got {slots}")
    out.mkdir(parents=True, exist_ok=True)
    gate = Gate(make_step, profiles, slots, costs, lambda each: track(each, description="capturing replicas"))
    loaded = runtime_plans.load(plans, gate.problem)
    seconds = estimate(costs, link or uniform_link(COPY_US, LINK_GBPS)) if costs is not None else None
    contention = Contention.of(costs)
    results: dict = {"command": " ".join(["kernelfleet"] + sys.argv[1:]), "devices": {n: asdict(s) for n, s in profiles.items()},
                     "slots": slots, "strategies": {}}
    stream = torch.cuda.Stream(device=profiles[gate.devices[0]].device)  # graphs launch and are timed here
    for name, replica in gate.slots[0].items():  # what the CPU replays: both captures of one slot
        replica.captured.raw.save(out / f"{name}.capture.json.gz")
    with gate:
        todo = strategies(loaded, gate.devices, slots, None, len(gate.program.launches))
        for pass_ in range(2):  # the singles first: request distribution splits slots by their rates
            for s in track(todo, description="gate and time", console=console):
                try:
                    found = measure(gate, s, repeats, stream, seconds, contention)
                except Exception as exc:  # a strategy the replicas cannot run is reported, never timed
                    found = {"gate": f"refused: {exc}"}
                found["model_seconds"] = s.model_seconds
                results["strategies"][s.name] = found
                (out / "disagg.json").write_text(json.dumps(results, indent=1, default=str))
            if pass_ == 0:
                rates = {d: results["strategies"][f"single:{d}"].get("slots_per_second") for d in gate.devices}
                if None in rates.values():
                    break
                todo = strategies(loaded, gate.devices, slots, rates, len(gate.program.launches), seconds)
    show(results, console)
    return results


def show(results: dict, console: Console) -> None:
    found = results["strategies"]
    rated = {n: r["slots_per_second"] for n, r in found.items() if "slots_per_second" in r}
    baselines = [rate for n, rate in rated.items()  # in every slot mode ("replicas, slots free" too)
                 if n.startswith("single") or n.split(",")[0] in ("replicas", "pipeline", "attention-ffn")]
    best = max(baselines) if baselines else None
    table = Table(title=f"kernelfleet bench disagg — {results['slots']} slots per graph")
    for column in ("strategy", "gate", "ms / graph", "predicted ms", "slots/s", "vs best baseline", "copies", "copy MB",
                   "plan's model ms / slot"):
        table.add_column(column)
    for name, r in found.items():
        rate = r.get("slots_per_second")
        table.add_row(name, r["gate"][:60], f"{r['seconds'] * 1e3:.2f}" if "seconds" in r else "-",
                      f"{r['predicted_seconds'] * 1e3:.2f}" if r.get("predicted_seconds") else "-",
                      f"{rate:.2f}" if rate else "-", f"{rate / best:.2f}x" if rate and best else "-",
                      str(r.get("copies", "-")), f"{r['copy_bytes'] / 1e6:.1f}" if "copy_bytes" in r else "-",
                      f"{r['model_seconds'] * 1e3:.1f}" if r.get("model_seconds") else "-")
    console.print(table)
    if (pick := chosen(found)) is not None:
        timed = {n: r["seconds"] / r["slots"] for n, r in found.items() if n in candidates(found)}
        console.print(f"the planner's model chooses {pick} ({found[pick]['predicted_seconds'] * 1e3:.3f} ms predicted, "
                      f"{timed[pick] * 1e6:.1f} µs/slot measured; fastest measured {min(timed, key=timed.get)} "
                      f"{min(timed.values()) * 1e6:.1f} µs/slot)")
    console.print(f"command: {results['command']}")
