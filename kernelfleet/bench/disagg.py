"""``kernelfleet bench disagg``: every placement strategy for one step on the emulated
complementary pair, measured in one run, each behind the correctness gate (runs on GPUs).

The two devices are device profiles (``profile/devices.py``) named as the plans name them —
on two H200s, "compute" (56 SMs + a 64-SM copy hog, L40S-like) on one GPU and "bandwidth" (32 SMs,
A100-like) on the other. Every strategy runs ``slots`` micro-batches of the step, each slot with
replicas of its own, as one CUDA graph (``runtime/executor.py``); its time is the median of
``repeats`` graph launches and its rate is slots per second. Strategies:

* ``single:<device>``: every slot whole on one device;
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
  time ``slots.makespan`` predicts.

Before a strategy is timed, the executor checks its plan graph has no race (``schedule.races``) and the
GPU runs it once from the captured state: each slot's outputs must equal, bit for bit, its own
capture's graph replay. A strategy failing either is reported, never timed.
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

from kernelfleet.errors import UsageError
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import capture
from kernelfleet.kernels.ir import Program
from kernelfleet.kernels.cuda.replay import saved_state
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec
from kernelfleet.profile.timing import median_seconds
from kernelfleet.runtime.executor import Built, Replica, Slot, build, release, run
from kernelfleet.runtime.link import Throttle
from kernelfleet.costs.table import CostTable
from kernelfleet.plan.model import Plan
from kernelfleet.plan.schedule import Node
from kernelfleet.plan.slots import estimate, makespan
from kernelfleet.workloads.steps import Step

LINKS_GBIT = (200, 100, 25)


@dataclass
class Strategy:
    name: str
    assignments: list[list[str]]  # one per slot
    homes: list[str]
    options: dict = field(default_factory=dict)
    model_seconds: float | None = None  # the planner's time per request, where a plan gives one


def load_plans(folder: Path, program: Program, devices: list[str]) -> dict[str, Plan]:
    """The plans of ``folder`` (each JSON file a plan) that place every launch of ``program`` on
    ``devices``, by policy."""
    plans = {}
    for path in sorted(folder.glob("*.json")):
        plan = Plan.from_json(path.read_text(), str(path))
        assignment = plan.assignment
        if not assignment:  # the replicas plan is a share of requests, measured as its own strategy
            continue
        if len(assignment) != len(program.launches):
            raise UsageError(f"{path}: the plan places {len(assignment)} launches, the captured step has "
                             f"{len(program.launches)}: it was made for another program")
        unknown = sorted(set(assignment) - set(devices))
        if unknown:
            raise UsageError(f"{path}: the plan uses {', '.join(unknown)}, the pair is {', '.join(devices)}")
        plans[plan.policy] = plan
    return plans


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
    out = [Strategy("replicas", [[d] * n for d in split], split),
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


def capture_replicas(make_step: Callable[[str, int], Step], gpus: dict[str, int],
                     seed: int = 0) -> tuple[dict[str, Replica], list[Callable[[], None]]]:
    """One capture of the step per named device, on its GPU, and what restores each one's captured
    state (bench disagg, bench serve, bench/executor_check.py and bench/plan_bisect.py replay them)."""
    replicas, restores = {}, []
    for name, gpu in gpus.items():
        torch.cuda.set_device(gpu)
        step = make_step(f"cuda:{gpu}", seed)
        captured = capture(step.fn, step.args, module=step.module, what=step.name)
        replicas[name] = Replica(captured, assemble(captured.raw))
        restores.append(saved_state(replicas[name].program))
    return replicas, restores


def differing_elements(references: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """Elements of ``outputs`` that differ from their ``references``, bit for bit."""
    return sum(int((a != b).sum()) for a, b in zip(references, outputs))


def restore_all(restores: list[Callable[[], None]]) -> None:
    """Put every replica back in its captured state, and wait for it."""
    for restore in restores:
        restore()
    torch.cuda.synchronize()


class Bench:
    """Replicas of the step per slot and device, their references, and the gate-then-time loop."""

    def __init__(self, make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], slots: int,
                 costs: CostTable | None = None) -> None:
        self.devices = list(profiles)
        self.slots: list[dict[str, Replica]] = []
        self.restores: list[Callable[[], None]] = []
        for k in track(range(slots), description="capturing replicas"):
            replicas, restores = capture_replicas(make_step, {name: spec.device for name, spec in profiles.items()}, k)
            self.slots.append(replicas)
            self.restores += restores
        self.reset()
        self.references = []
        for replicas in self.slots:  # each capture's own graph replay, whole GPU, from the captured state
            for name, replica in replicas.items():
                with torch.cuda.device(profiles[name].device):
                    replica.captured.replay()
            torch.cuda.synchronize()
            self.references.append({d: [t.clone() for t in r.captured.output_tensors()] for d, r in replicas.items()})
        self.reset()
        self.profiles = {name: DeviceProfile(spec) for name, spec in profiles.items()}
        if costs is not None and len(costs.seconds) != len(self.program.launches):
            raise UsageError(f"the cost table has {len(costs.seconds)} launches, the captured step "
                             f"{len(self.program.launches)}: it was made for another program")
        self.seconds = estimate(costs) if costs is not None else None

    def reset(self) -> None:
        restore_all(self.restores)

    def __enter__(self) -> Bench:
        for name, profile in self.profiles.items():
            profile.__enter__()
            for replicas in self.slots:
                replicas[name].context = profile.context
        return self

    def __exit__(self, *exc: object) -> None:
        for profile in self.profiles.values():
            profile.__exit__(*exc)

    @property
    def program(self) -> Program:
        return self.slots[0][self.devices[0]].program

    def graph(self, strategy: Strategy) -> Built:
        """The strategy's graph over the first ``len(strategy.assignments)`` slots; ``release`` it."""
        used = self.slots[:len(strategy.assignments)]
        options = {"resident_state": True, **strategy.options}
        return build([Slot(r, a, h) for r, a, h in zip(used, strategy.assignments, strategy.homes)], **options)

    def clear_outputs(self, homes: list[str]) -> None:
        """Zero the outputs of slot k at ``homes[k]``, so only a run that writes them can match."""
        for replicas, home in zip(self.slots, homes):
            for t in replicas[home].captured.output_tensors():
                t.fill_(0)

    def differing(self, homes: list[str]) -> dict[int, int]:
        """Elements of slot k's outputs at ``homes[k]`` that differ from its reference, for the
        slots where any does."""
        wrong = {k: differing_elements(self.references[k][home], replicas[home].captured.output_tensors())
                 for k, (replicas, home) in enumerate(zip(self.slots, homes))}
        return {k: n for k, n in wrong.items() if n}

    def gate(self, built: Built, homes: list[str], stream: torch.cuda.Stream) -> str:
        """Run ``built`` once from the captured state, outputs zeroed: "identical" when every slot's
        outputs equal its own single-device replay bit for bit, else what differs."""
        self.reset()
        self.clear_outputs(homes)
        run(built, stream.cuda_stream)
        stream.synchronize()
        wrong = self.differing(homes)
        return f"outputs differ from the single-device run (slot: elements) {wrong}" if wrong else "identical"

    def measure(self, strategy: Strategy, repeats: int, stream: torch.cuda.Stream) -> dict:
        built = self.graph(strategy)
        predicted = None  # the graph's time as plan/slots.py predicts it
        if self.seconds is not None:
            predicted = makespan(built.combined, lambda x: self.seconds(x.slot, x.node))
        try:
            gate = self.gate(built, strategy.homes, stream)
            if gate != "identical":
                return {"gate": gate}
            seconds = median_seconds(lambda: run(built, stream.cuda_stream), stream, repeats)
            return {"gate": "identical", "seconds": seconds, "predicted_seconds": predicted, "slots": built.slots,
                    "slots_per_second": built.slots / seconds, "copies": len(built.copies),
                    "copy_bytes": built.copy_bytes, "method": built.method}
        finally:
            release(built)


def disagg(make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], plans: Path, slots: int,
           repeats: int, out: Path, console: Console, costs: CostTable | None = None) -> dict:
    """Run every strategy (module docstring); write and return the results. ``costs``: the cost
    table the plans were made from, for list-scheduled slots and each graph's predicted time."""
    if slots < 2:
        raise UsageError(f"--slots must be at least 2 (request distribution needs one per device), got {slots}")
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(make_step, profiles, slots, costs)
    loaded = load_plans(plans, bench.program, bench.devices)
    results: dict = {"command": " ".join(["kernelfleet"] + sys.argv[1:]), "devices": {n: asdict(s) for n, s in profiles.items()},
                     "slots": slots, "strategies": {}}
    stream = torch.cuda.Stream(device=profiles[bench.devices[0]].device)  # graphs launch and are timed here
    for name, replica in bench.slots[0].items():  # what the CPU replays: both captures of one slot
        replica.captured.raw.save(out / f"{name}.capture.json.gz")
    with bench:
        todo = strategies(loaded, bench.devices, slots, None, len(bench.program.launches))
        for pass_ in range(2):  # the singles first: request distribution splits slots by their rates
            for s in track(todo, description="gate and time", console=console):
                try:
                    found = bench.measure(s, repeats, stream)
                except Exception as exc:  # a strategy the replicas cannot run is reported, never timed
                    found = {"gate": f"refused: {exc}"}
                found["model_seconds"] = s.model_seconds
                results["strategies"][s.name] = found
                (out / "disagg.json").write_text(json.dumps(results, indent=1, default=str))
            if pass_ == 0:
                rates = {d: results["strategies"][f"single:{d}"].get("slots_per_second") for d in bench.devices}
                if None in rates.values():
                    break
                todo = strategies(loaded, bench.devices, slots, rates, len(bench.program.launches), bench.seconds)
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
    console.print(f"command: {results['command']}")
