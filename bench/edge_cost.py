"""Benchmark: what a cross-device edge costs in a real step (on a GPU, under 3 minutes on one H200):

    python -m bench.edge_cost --out DIR [--targets dit-denoise ...] [--slots 2]
        [--repeats 20] [--link tests/data/h200-link/links.json]
    python -m bench.edge_cost --derive FILE    # on any machine: the fixture derived from the recorded run

For each target, on the same-kernel pair of tests/data/h200-place-pairs (``a:64``, ``b:32``: the
pair the calibration picked, disjoint partitions of one GPU), it profiles the step as
``bench.place_pairs`` does (``kernelfleet profile``: the cost table with its graph, shared and
free times), captures it on both partitions (``runtime/gate.Gate``, as ``bench disagg``), then runs
every plan of ``plan/edgerun.edge_plans`` (single devices, contiguous cuts with 1-32 switches,
1-32 single launches spread onto b, and each of them with its copies cut to zero bytes) through
the real executor with ``--slots`` requests chained, as ``bench disagg`` runs the recorded rows:
each gated on bit-identical outputs, then timed (median of ``--repeats`` launches). The zero-byte
twins compute wrong outputs by design: they are timed only after the plan passed its gate, with the
same copy method (where the driver refuses a copy of 0 bytes, of 4). ``DIR/edges.json``
(``kernelfleet_edge_run``) holds per plan the measured seconds, today's prediction (the flags'
link: ``--copy-us`` 4 µs + bytes at 25 GB/s), the prediction with the measured link of ``--link``,
and its counts (copies, bytes, waits and forks across streams, joins, the critical chain's copies,
waits and forks: ``plan/edges.py``); ``DIR/TARGET/`` keeps the profile's cost table, program and
log. ``python -m bench.place_table --edges DIR/edges.json`` fits the per-edge cost and
re-predicts the recorded run with it.

``--derive FILE`` writes instead, on the CPU, the same document from the recorded run's rows that
the placement table does not count (each same-kernel row's one-slot plans and conservative
ablations), named derived: the fixture the replay tests fit on, not an edge experiment.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench import Parser, command_line, gpu_folder
from kernelfleet.costs.links import LinkTable
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import KernelfleetError, UsageError
from kernelfleet.kernels.cuda.doorway import DriverError
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.contention import Contention
from kernelfleet.plan.edgerun import EdgePlan, EdgeRun, edge_plans, record
from kernelfleet.plan.links import COPY_US, LINK_GBPS
from kernelfleet.plan.slots import estimate, uniform_link
from kernelfleet.runtime.executor import Built, release

ROOT = Path(__file__).resolve().parents[1]
LINK = ROOT / "tests" / "data" / "h200-link" / "links.json"
# the default targets: dit-denoise, one of the recorded run's three many-copy misses. Qwen2-MoE
# decode, another, faulted the H200 in its cut-5 plan: a copy landed over aten.sort's index
# workspace (docs/validation/place-h200-pairs.md, "Edges in a real step"; fixed on the CPU since, and
# checked by plan.delivery), and a device-side fault ends the process's CUDA context, so it runs
# only when asked (--targets) until a GPU run shows the fix
TARGETS = ("dit-denoise",)
ZERO_BYTES = (0, 4)  # what a zero-byte twin's copies move: 0, else the least a driver refusing 0 takes
# the targets whose plans get zero-byte twins by default (--zero-copies): a twin computes on stale
# inputs, and a step whose kernels index by data can then fault the GPU. On the H200 Qwen2-MoE
# decode's twin did (a gather's device-side assert, which ends the process's CUDA context), so
# only steps without data-dependent indexing get them
ZERO_SAFE = ("dit-denoise",)
# the recorded rows --derive recasts: plans with copies that the placement table's chained rows leave out
DERIVED_ROWS = ("pipeline, 1 slot", "throughput-milp, 1 slot", "ablation: 1 slot, conservative",
                "ablation: slots chained, conservative")


class Runner(Protocol):
    """Builds, gates and times graphs of a step's replicas (``runtime/gate.Gate`` on a GPU)."""

    def graph(self, name: str, assignments: list[list[str]], homes: list[str], **options: Any) -> Built: ...

    def gate(self, built: Built, homes: list[str]) -> str: ...

    def seconds(self, built: Built) -> float: ...


@dataclass
class GateRunner:
    """The runner of a GPU: ``gate``'s graphs and verdicts, timed as ``bench disagg`` times them."""

    gate_: Any  # runtime.gate.Gate, entered
    stream: Any  # a torch stream of the home device
    repeats: int

    def graph(self, name: str, assignments: list[list[str]], homes: list[str], **options: Any) -> Built:
        return self.gate_.graph(name, assignments, homes, **options)

    def gate(self, built: Built, homes: list[str]) -> str:
        return self.gate_.gate(built, homes, self.stream)

    def seconds(self, built: Built) -> float:
        from kernelfleet.profile.timing import median_seconds
        from kernelfleet.runtime.executor import run

        return median_seconds(lambda: run(built, self.stream.cuda_stream), self.stream, self.repeats)


def models(table: CostTable, links: LinkTable | None) -> tuple[tuple, tuple | None]:
    """Today's model of ``table`` (a node estimate with the flags' link, and its contention), and the
    same with ``links`` in the table (None without)."""
    today = (estimate(table, uniform_link(COPY_US, LINK_GBPS)), Contention.of(table))
    if links is None:
        return today, None
    measured = table.with_links(links.links)
    return today, (estimate(measured, uniform_link(COPY_US, LINK_GBPS)), Contention.of(measured))


def passed(verdict: str) -> bool:
    from kernelfleet.runtime.gate import passed as gate_passed  # torch at import: only where a gate ran

    return gate_passed(verdict)


def measure_target(target: str, runner: Runner, program: Program, table: CostTable, links: LinkTable | None,
                   slots: int, devices: tuple[str, str] = ("a", "b"),
                   twins: bool = True) -> tuple[list[EdgePlan], list[str]]:
    """Every plan of ``edge_plans`` for one step, and with ``twins`` its zero-byte twin where it copies (module
    docstring): built by ``runner``, gated, timed, recorded beside the model's predictions; and a
    line for each plan the replicas could not run (reported, never timed, as ``bench disagg`` does)."""
    if len(table.seconds) != len(program.launches):
        raise UsageError(f"{target}: the cost table times {len(table.seconds)} launches, the capture made "
                         f"{len(program.launches)}: profile and capture the same step")
    today, link = models(table, links)
    first, second = devices
    out: list[EdgePlan] = []
    refused: list[str] = []
    for name, family, assignment in edge_plans(program, first, second):
        homes = [second if set(assignment) == {second} else first] * slots
        fields = {"target": target, "name": name, "family": family, "on_second": assignment.count(second),
                  "slots": slots}
        try:
            built = runner.graph(name, [assignment] * slots, homes)
        except KernelfleetError as exc:  # a plan the replicas cannot run: reported, never timed
            refused.append(f"{target} {name}: {exc}")
            continue
        try:
            verdict = runner.gate(built, homes)
            measured = runner.seconds(built) if passed(verdict) else None
            out.append(record(built.combined, "sequential", today, link, gate=verdict, measured_seconds=measured,
                              method=built.method, **fields))
        except (DriverError, RuntimeError) as exc:  # the driver (or torch, gating) refused to run it: the same
            refused.append(f"{target} {name}: {exc}")
            continue
        finally:
            release(built)
        if twins and measured is not None and built.method is not None:
            twin = _zero_bytes(runner, today, link, [assignment] * slots, homes, built.method, fields)
            out += [twin] if twin else []
            refused += [] if twin else [f"{target} {name}: a copy of {ZERO_BYTES[-1]} bytes refused"]
    return out, refused


def _zero_bytes(runner: Runner, today: tuple, link: tuple | None, assignments: list[list[str]], homes: list[str],
                method: str, fields: dict) -> EdgePlan | None:
    """The plan's graph with every copy cut to the first size of ``ZERO_BYTES`` the driver takes,
    by the plan's own copy ``method``, timed without the gate (its outputs are wrong by design)."""
    for cap in ZERO_BYTES:
        try:
            twin = runner.graph(fields["name"], assignments, homes, method=method, copy_cap_bytes=cap)
        except DriverError:
            continue  # refused at this size (built or instantiated): the next
        try:
            return record(twin.combined, "sequential", today, link, cap, measured_seconds=runner.seconds(twin),
                          gate=f"not gated: copies cut to {cap} bytes (the plan above passed)", method=twin.method,
                          **{**fields, "name": f"{fields['name']}, copies {cap} B"})
        except DriverError:
            continue  # refused at launch: the next
        finally:
            release(twin)
    return None


def derived(folders: list[Path], links: LinkTable | None) -> EdgeRun:
    """The recorded rows of ``DERIVED_ROWS`` in each same-kernel folder, recast as edge plans (module
    docstring) with today's table as ``bench.place_table`` recomputes it."""
    from bench import place_calibration
    from kernelfleet.bench.disagg import strategies
    from kernelfleet.plan.model import Device, Plan
    from kernelfleet.runtime import plans as runtime_plans
    from kernelfleet.runtime.executor import plan_graph

    out = []
    for folder in folders:
        run = json.loads((folder / "disagg.json").read_text())
        found = run["strategies"]
        program = Program.load(folder / "program.json.gz")
        costs = place_calibration.profiled(folder)
        table = place_calibration.corrected(costs, costs.graph_seconds or place_calibration.graph_seconds(found),
                                            "contention")
        today, link = models(table, links)
        plans = {p.policy: p for p in (Plan.from_json(f.read_text(), str(f)) for f in folder.glob("plan.*.json"))
                 if p.assignment}
        devices = list(run["devices"])
        rates = {d: found[f"single:{d}"]["slots_per_second"] for d in devices}
        checked = runtime_plans.problem(program, [Device(d) for d in devices])
        for s in strategies(plans, devices, run["slots"], rates, len(program.launches)):
            if (s.name not in DERIVED_ROWS or not found.get(s.name, {}).get("seconds")
                    or place_calibration.refusal(checked, s) is not None):
                continue  # a plan today's validator refuses is no plan the model predicts
            _, combined = plan_graph([(program, a, h) for a, h in zip(s.assignments, s.homes)],
                                     s.options.get("overlap", True), resident_state=True)
            out.append(record(combined, "sequential", today, link, target=folder.name.rpartition(".")[0],
                              name=s.name, family="recorded", on_second=s.assignments[0].count(devices[1]),
                              slots=len(s.assignments), gate=found[s.name]["gate"],
                              measured_seconds=found[s.name]["seconds"], method=found[s.name].get("method")))
    return EdgeRun(out, "derived on the CPU from tests/data/h200-place-pairs: the one-slot and conservative-ablation "
                        "rows of the same-kernel folders, none of the chained rows the placement table counts; "
                        "a fixture, not an edge experiment", command_line(), derived=True,
                   link_source=None if links is None else links.source)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="Folder for edges.json and each target's profile.")
    parser.add_argument("--derive", type=Path, help="Write the fixture derived from the recorded run here instead "
                        "(on any machine).")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), help="Targets of bench.place_pairs.")
    parser.add_argument("--zero-copies", nargs="*", default=list(ZERO_SAFE), help="Targets whose plans also run "
                        "with their copies cut to zero bytes (default: those without data-dependent indexing, "
                        f"{', '.join(ZERO_SAFE)}).")
    parser.add_argument("--slots", type=int, default=2, help="Requests per graph, chained (the recorded rows': 2).")
    parser.add_argument("--repeats", type=int, default=20, help="Graph launches timed per plan (median).")
    parser.add_argument("--trials", type=int, default=3, help="Profile trials per launch.")
    parser.add_argument("--link", type=Path, default=LINK, help="A measured link (bench.link_cost's links.json) "
                        "for the second prediction (default: the committed H200 one).")
    args = parser.parse_args(argv)
    try:
        if (args.out is None) == (args.derive is None):
            raise UsageError("give --out DIR (on a GPU) or --derive FILE (on any machine)")
        if args.slots < 1 or args.repeats < 1:
            raise UsageError(f"--slots and --repeats must be at least 1, got {args.slots} and {args.repeats}")
        links = LinkTable.load(args.link)
        if args.derive is not None:
            from bench.place_table import RECORDED

            run = derived(sorted(p.parent for p in RECORDED.glob("*.same/disagg.json")), links)
            run.save(args.derive)
            print(f"wrote {args.derive}: {len(run.plans)} plans derived from {RECORDED}\n{command_line()}")
            return 0
        return _run(args, links)
    except KernelfleetError as exc:
        print(f"bench.edge_cost: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, links: LinkTable) -> int:
    import torch

    from bench.place_pairs import PAIRS, REFERENCE, TRANSFORMERS, run_row, target_of
    from kernelfleet.plan.command import load_costs
    from kernelfleet.profile.run import parse_profile
    from kernelfleet.runtime.gate import Gate
    from kernelfleet.serve.plan_buckets import on_gpu
    from kernelfleet.workloads.targets import step_maker

    unknown = [t for t in args.targets if t not in (*REFERENCE, *TRANSFORMERS)]
    if unknown:
        raise UsageError(f"--targets: unknown {', '.join(unknown)}; expected some of {', '.join(REFERENCE + TRANSFORMERS)}")
    gpu_folder(args.out, "the edges are timed on the GPU the plans run on (--derive runs anywhere)")
    profiles = {spec.name: spec for spec in (parse_profile(on_gpu(p)) for p in PAIRS["same"])}
    plans: list[EdgePlan] = []
    refused: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for name in args.targets:
            print(f"{name}: profile", flush=True)
            row = run_row(name, "same", args.out / name, work, args.slots, args.repeats, args.trials, ("profile",))
            if "failed" in row:
                raise UsageError(f"{name}: {row['failed']} (log in {args.out / name / 'log.txt'})")
            table = load_costs(args.out / name / "costs.json")
            gate = Gate(step_maker(target_of(name, work)), profiles, args.slots, table)
            stream = torch.cuda.Stream(device=profiles["a"].device)
            print(f"{name}: edge plans", flush=True)
            with gate:
                found, missed = measure_target(name, GateRunner(gate, stream, args.repeats), gate.program, table,
                                               links, args.slots, twins=name in args.zero_copies)
            plans += found
            refused += missed
            run = EdgeRun(plans, f"measured on {torch.cuda.get_device_name(0)}, profiles {' '.join(PAIRS['same'])}, "
                                 f"{args.slots} slots chained, {args.repeats} repeats; link {args.link}", command_line(),
                          refused=refused, link_source=links.source)
            run.save(args.out / "edges.json")  # after each target: a later failure keeps the earlier
    print(table_of(plans), *(f"refused: {line}" for line in refused), f"wrote {args.out / 'edges.json'}", command_line(), sep="\n")
    return 0


def table_of(plans: list[EdgePlan]) -> str:
    """Markdown: per plan its counts, measured and predicted µs of the graph."""
    head = ("| target | plan | gate | copies | bytes | waits | forks | critical copies | measured (µs) "
            "| today (µs) | measured link (µs) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in plans:
        c = p.counts
        shown = [f"{x * 1e6:.1f}" if x is not None else "-" for x in (p.measured_seconds, p.predicted_seconds,
                                                                       p.predicted_link_seconds)]
        lines.append(f"| {p.target} | {p.name} | {p.gate[:24]} | {c.copies} | {c.copy_bytes} | {c.waits} | {c.forks} "
                     f"| {c.critical_copies} | {' | '.join(shown)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
