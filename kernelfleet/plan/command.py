"""What ``kernelfleet plan`` does, as functions on plain data (the CLI only parses and prints).

:func:`setup` reads the program and cost table, adds catalog SKUs the table has not measured
through the roofline cost model (``costs/model.py``) and builds the :class:`Problem`;
:func:`make_plans` runs the chosen policy with every baseline beside it; :func:`table` gives
the rows to print and :func:`write` the plan files. Every plan written carries the cost
table's source in ``details.costs_source``, so a plan made from predicted costs says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from kernelfleet.catalog.model import PRECISIONS
from kernelfleet.costs.links import describe, find
from kernelfleet.costs.table import CostTable
from kernelfleet.documents import read_text
from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import kernel_kind
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.baselines import baselines
from kernelfleet.plan.links import check_link
from kernelfleet.plan.model import PLANNED_PROGRAM, STATE_HOME, Device, Link, Plan, Problem, weights_kept
from kernelfleet.plan.model import state_home as pin_state
from kernelfleet.plan.policy import throughput
from kernelfleet.plan.slots import fastest_mode
from kernelfleet.plan.validate import evaluate

# Requests in flight a plan is made for: slots of one graph, each with replicas of its own, so memory
# bounds them long before this; the prediction simulates every slot (the cost grows with K).
MAX_IN_FLIGHT = 256
# Two strategies predicted this close are a tie to the model: on one H100 (2026-12-06) profile's own
# graph of one device with free slots moved 3.4 % between calls, and such a tie chose 1.038x the best
# (docs/validation/place-h200-pairs.md); the placement benchmark's choice target is 3 % too
NEAR_TIE = 0.03
POLICIES = ("throughput", "latency", "single", "replicas", "pipeline", "attention-ffn", "all")
GB = 1e9


@dataclass
class Setup:
    problem: Problem
    notes: list[str] = field(default_factory=list)  # lines to show above the table


def parse_device(spec: str) -> Device:
    """NAME or NAME:MEMORY_GB (decimal gigabytes)."""
    name, sep, gb = spec.rpartition(":")
    if not sep:
        return Device(spec)
    try:
        memory = float(gb)
    except ValueError:
        raise UsageError(f"--device {spec!r}: expected NAME or NAME:MEMORY_GB, e.g. l40s:48") from None
    if not name or memory <= 0:
        raise UsageError(f"--device {spec!r}: expected NAME or NAME:MEMORY_GB with a positive size")
    return Device(name, int(memory * GB))


def parse_link(spec: str, names: list[str]) -> Link:
    """DEVICE:DEVICE:GBPS (gigabytes per second), both ends known devices."""
    parts = spec.split(":")
    try:
        a, b, gbps = parts[0], parts[1], float(parts[2])
        if len(parts) != 3 or gbps <= 0:
            raise ValueError
    except (IndexError, ValueError):
        raise UsageError(
            f"--link {spec!r}: expected DEVICE:DEVICE:GBPS with a positive GB/s, e.g. l40s:a100:25"
        ) from None
    for end in (a, b):
        if end not in names:
            raise UsageError(f"--link {spec!r}: unknown device {end!r} (devices: {', '.join(names)})")
    if a == b:
        raise UsageError(f"--link {spec!r}: a link joins two different devices")
    return Link(a, b, gbps * GB)


def load_costs(path: Path) -> CostTable:
    """The cost table in ``path``, each device's column scaled to its measured whole-step graph
    where the table has one (``CostTable.calibrated``; the source then says so)."""
    return CostTable.from_json(read_text(path), str(path)).calibrated()


def setup(
    program_path: Path,
    costs_path: Path,
    devices: list[str],
    links: list[str],
    link_gbps: float,
    predict: list[str],
    profiles: list[str],
    catalog_path: Path | None = None,
    copy_us: float = 0.0,
    keep_home: bool = False,
    edge_fit_path: Path | None = None,
    state_home: bool = False,
    weights_like: Path | None = None,
) -> Setup:
    """The problem the CLI plans: devices from ``--device`` (default: every measured device) plus
    ``--predict`` SKUs, links from ``--link`` with ``link_gbps`` for every pair left out, each copy
    over any of them ``copy_us`` microseconds beyond its bytes; ``keep_home``: as Problem's;
    ``edge_fit_path``: a per-edge fit (``kernelfleet_edges``) the slot-mode predictions charge;
    ``state_home``: the step's state pinned home (``model.state_home``), and ``keep_home``;
    ``weights_like``: a plan whose weight placement every plan keeps (``model.weights_kept``)."""
    from kernelfleet.plan.edges import EdgeFit

    edge_fit = None if edge_fit_path is None else EdgeFit.load(edge_fit_path)
    program = Program.load(program_path)
    if state_home:
        program, keep_home = pin_state(program), True
    costs = load_costs(costs_path)
    measured = sorted({d for row in costs.seconds for d, v in row.items() if v is not None})
    chosen = [parse_device(spec) for spec in devices] or [Device(d) for d in measured]
    notes = [f"costs: {costs.source}"] + implausible_note(costs, catalog_path)
    if state_home:
        pinned = sum(launch.pinned == STATE_HOME for launch in program.launches)
        if not pinned:
            raise UsageError(f"--state-home: {program_path} has no state (named buffers, neither weights, inputs nor "
                             "outputs, that the step writes): it is not a step a server carries state across "
                             "(profile hf:DIR,serve-decode,...)")
        notes.append(f"state home: the {pinned} launches that touch the step's state are pinned to the home device, "
                     "and every plan keeps its home")
    if weights_like is not None:
        costs = _weights_like(weights_like, program, costs)
        notes.append(f"weights like {weights_like}: each launch that reads weights runs only where that plan keeps "
                     "them")
    if predict:
        costs, predicted, note = _predict(program, costs, measured, predict, profiles, catalog_path)
        notes.append(note)
        chosen += [d for d in predicted if d.name not in {c.name for c in chosen}]
    names = [d.name for d in chosen]
    have = {d for row in costs.seconds for d, v in row.items() if v is not None}
    for name in names:
        if name not in have:
            raise UsageError(
                f"device {name!r} has no costs in {costs_path} (measured: {', '.join(measured)}); "
                f"add --predict {name} for a catalog SKU"
            )
    check_link(link_gbps, copy_us)
    given = {frozenset((lk.a, lk.b)): lk for lk in (parse_link(spec, names) for spec in links)}
    all_links = [
        measured_link(costs, a, b)
        or replace(given.get(frozenset((a, b)), Link(a, b, link_gbps * GB)), seconds_per_copy=copy_us * 1e-6)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]
    notes.append(link_note(costs, names, copy_us, link_gbps))
    if edge_fit is not None:
        notes.append(f"edges: every prediction in a slot mode charges {edge_fit.describe()}, fitted on "
                     f"{edge_fit.fitted_on} (the MILP's objective does not)")
    # the devices' measured graphs stay: the slot-mode model (plan/contention.py) reads them
    return Setup(Problem(program, chosen, all_links, costs.restricted(names), keep_home=keep_home,
                         edge_fit=edge_fit), notes)


def measured_link(costs: CostTable, a: str, b: str) -> Link | None:
    """The planners' link between ``a`` and ``b`` from the table's measurement (``CostTable.links``),
    or None: a copy between kernels and the two waits across devices around it, at its bandwidth."""
    link = find(costs.links, a, b)
    if link is None:
        return None
    return Link(a, b, link.between.bytes_per_second, link.between.seconds_per_copy + 2 * link.wait_seconds)


def link_note(costs: CostTable, names: list[str], copy_us: float, link_gbps: float) -> str:
    """Which link model the plans use: the table's measured links, or the flags' where it has none."""
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    found = [link for a, b in pairs if (link := find(costs.links, a, b)) is not None]
    flags = f"--copy-us {copy_us:g} µs + bytes at --link-gbps {link_gbps:g} GB/s (or --link)"
    if not found:
        return f"links: not measured in the cost table; every copy costs {flags}"
    lines = [describe(link) for link in found]
    if len(found) < len(pairs):
        lines.append(f"the other pairs: {flags}")
    return "links: " + "; ".join(lines)


def implausible_note(costs: CostTable, catalog_path: Path | None) -> list[str]:
    """A warning, if any launch's time implies more FLOP/s than the fastest GPU of the catalog
    has for its precision (dense): such times are wrong, and so is a plan made on them."""
    from kernelfleet.catalog import Catalog

    skus = list(Catalog.load(catalog_path))
    ceiling = {p: max(peaks) for p in PRECISIONS if (peaks := [f for s in skus if (f := s.peak_flops(p))])}
    found = costs.faster_than(ceiling)
    if not found:
        return []
    k, device, rate = max(found, key=lambda x: x[2])
    launches = len({x[0] for x in found})
    return [(f"warning: {launches} launches take less time than any GPU of the catalog could (launch {k} on {device}: "
             f"{rate / 1e12:,.0f} TFLOP/s {costs.precision[k]}); those times are wrong, and plans made on them are not "
             "to be trusted (a stream-K GEMM or cuDNN attention timed without its memset skips its work)")]


def _weights_like(path: Path, program: Program, costs: CostTable) -> CostTable:
    """``costs`` kept to the weight placement of the plan ``path`` (``model.weights_kept``), whose
    program is the ``PLANNED_PROGRAM`` beside it; UsageError naming what is missing or wrong."""
    beside = path.parent / PLANNED_PROGRAM
    if not beside.is_file():
        raise UsageError(f"--weights-like {path}: no {PLANNED_PROGRAM} beside it (kernelfleet plan --policy all "
                         "--out writes the plans with their program)")
    reference, plan = Program.load(beside), Plan.load(path)
    if len(plan.assignment) != len(reference.launches):
        raise UsageError(f"--weights-like {path}: a plan of {len(plan.assignment)} launches, {beside} has "
                         f"{len(reference.launches)}: not its plan")
    return weights_kept(costs, program, reference, plan, f"--weights-like {path}")


def _predict(
    program: Program,
    costs: CostTable,
    measured: list[str],
    predict: list[str],
    profiles: list[str],
    catalog_path: Path | None,
) -> tuple[CostTable, list[Device], str]:
    import json

    from kernelfleet.catalog import Catalog
    from kernelfleet.costs.model import Capability, predict_table

    catalog = Catalog.load(catalog_path)
    targets = {key: catalog.get(key) for key in predict}  # UsageError naming the known keys
    devices = [Device(key, sku.memory_bytes) for key, sku in targets.items()]
    targets = {key: sku for key, sku in targets.items() if key not in measured}
    if not targets:
        return costs, devices, f"--predict {', '.join(predict)}: measured already, nothing to predict"
    capabilities: dict[str, Capability] = {}
    for spec in profiles:
        name, sep, what = spec.partition("=")
        if not sep or not name or not what:
            raise UsageError(f"--profile {spec!r}: expected NAME=SKU or NAME=CALIBRATION.json")
        if what.endswith(".json"):
            try:
                capabilities[name] = Capability.from_dict(json.loads(Path(what).read_text()), what)
            except (OSError, ValueError) as exc:
                raise UsageError(f"--profile {spec!r}: cannot read {what} ({exc})") from exc
        else:
            capabilities[name] = Capability.from_sku(catalog.get(what))
    for name in measured:
        if name not in capabilities:
            if name not in catalog:
                raise UsageError(
                    f"--predict needs to know what measured device {name!r} is: "
                    f"add --profile {name}=SKU (a catalog key) or --profile {name}=CALIBRATION.json"
                )
            capabilities[name] = Capability.from_sku(catalog.get(name))
    kinds = [kernel_kind(launch) for launch in program.launches]
    table, model, error = predict_table(
        costs, kinds, capabilities, {key: Capability.from_sku(sku) for key, sku in targets.items()}
    )
    paths = ", ".join(f"{n} {path}" for path, n in sorted(model.paths().items()))
    note = (
        f"cost model: roofline fitted on {', '.join(model.devices)}, overhead "
        f"{model.overhead_seconds * 1e6:.2f} µs, launches by path: {paths}; "
        + (error.summary() if error else "no leave-one-device-out error (one measured device)")
    )
    return table, devices, note


def make_plans(problem: Problem, policy: str, time_limit_seconds: float,
               in_flight: int | None = None) -> tuple[Plan | None, list[Plan]]:
    """The chosen plan (None for "all") and every plan evaluated, chosen first. ``in_flight``
    (requests in flight) makes the throughput plan the one predicted fastest per request at
    that many (``policy.throughput``)."""
    if policy not in POLICIES:
        raise UsageError(f"--policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if time_limit_seconds <= 0:
        raise UsageError(f"--time-limit must be positive, got {time_limit_seconds}")
    if in_flight is not None and not 1 <= in_flight <= MAX_IN_FLIGHT:
        raise UsageError(f"--in-flight must be at least 1 and at most {MAX_IN_FLIGHT} requests, got {in_flight}")
    if policy in ("throughput", "all"):
        milp, plans, skipped = throughput(problem, time_limit_seconds=time_limit_seconds, in_flight=in_flight)
        plans = [milp] + plans
    else:
        plans, skipped = baselines(problem)
    for plan in plans:
        plan.details.costs_source = problem.costs.source
        if in_flight is not None:  # the mode kernelfleet run takes, as the plan's prediction at K assumed
            plan.slot_mode = fastest_mode(problem, plan, in_flight) or plan.slot_mode
    if policy == "all":
        return None, plans
    wanted = {"throughput": "throughput-milp", "latency": "latency-greedy"}.get(policy, policy)
    found = [
        p for p in plans if p.policy == wanted or (policy == "single" and p.policy.startswith("single:"))
    ]
    if not found:
        why = skipped.get(wanted) or next((v for k, v in skipped.items() if k.startswith(wanted)), None)
        raise UsageError(
            f"no valid {policy} plan for this problem: {why or 'it does not apply to this program'}"
        )
    chosen = min(found, key=lambda p: p.details.throughput_seconds)
    return chosen, [chosen] + [p for p in plans if p is not chosen]


def verdict(plans: list[Plan]) -> str | None:
    """One line comparing kernel placement with the strongest control, request distribution: in
    steady state, or with the throughput plan's requests in flight where it was made for them."""
    by_policy = {p.policy: p for p in plans}
    if "throughput-milp" not in by_policy or "replicas" not in by_policy:
        return None
    flight = by_policy["throughput-milp"].details.in_flight
    if flight is not None:
        k, milp = flight.requests, flight.per_request_seconds
        replicas = next((c.per_request_seconds for c in flight.candidates if c.plan == "replicas"), None)
        if replicas is None:
            return None
        if milp < replicas:
            return (f"with {k} requests in flight, kernel placement ({flight.chosen}) serves {replicas / milp:.2f}x "
                    "the requests of two independent replicas (predicted)")
        return (f"with {k} requests in flight, two independent replicas serve {milp / replicas:.2f}x the requests "
                f"of the best kernel placement found ({flight.chosen}, predicted): run replicas on this pair")
    milp, replicas = (by_policy[p].details.throughput_seconds for p in ("throughput-milp", "replicas"))
    if milp < replicas:
        return f"kernel placement serves {replicas / milp:.2f}x the requests of two independent replicas"
    return (f"two independent replicas serve {milp / replicas:.2f}x the requests of the best kernel placement "
            "found: run replicas on this pair")


def near_ties(predicted: dict[str, float], within: float = NEAR_TIE) -> tuple[str | None, list[str]]:
    """The fastest of ``predicted`` (seconds a request by a plan's name in a slot mode; the first name
    of a tie) and the others within ``within`` of it, faster first: not those predicted the very same
    (the same graph, such as one device's plan and a placement that keeps every launch there). None
    and none where nothing was predicted."""
    if not predicted:
        return None, []
    fastest = min(predicted, key=lambda name: (predicted[name], name))
    best = predicted[fastest]
    close = [name for name, value in predicted.items() if best * (1 + 1e-9) < value <= best * (1 + within)]
    return fastest, sorted(close, key=predicted.get)


def table(problem: Problem, plans: list[Plan], chosen: Plan | None) -> tuple[list[str], list[list[str]]]:
    """Header and rows: every plan's figures under the validator's cost model."""
    header = ["plan", "time/request", "latency", "lower bound", "gap", "cut edges", "cut MB"]
    header += [f"{d} busy · mem" for d in problem.names]
    rows = []
    for plan in plans:
        ev = evaluate(problem, plan)
        cut = [
            e for e in problem.edges if plan.assignment and plan.assignment[e.src] != plan.assignment[e.dst]
        ]
        bound = plan.lower_bound_seconds
        gap = "—" if not bound else f"{100 * (ev.throughput_seconds / bound - 1):.1f}%"
        rows.append(
            [
                ("* " if plan is chosen else "") + plan.policy,
                seconds(ev.throughput_seconds),
                seconds(ev.latency_seconds),
                "—" if bound is None else seconds(bound),
                gap,
                str(len(cut)),
                f"{sum(e.bytes for e in cut) / 1e6:.1f}",
            ]
            + [f"{seconds(ev.busy_seconds[d])} · {ev.memory_bytes[d] / GB:.2f} GB" for d in problem.names]
        )
    return header, rows


def seconds(value: float) -> str:
    return (
        f"{value * 1e6:.1f} µs"
        if value < 1e-3
        else f"{value * 1e3:.2f} ms"
        if value < 1
        else f"{value:.2f} s"
    )


def write(plans: list[Plan], chosen: Plan | None, out: Path, program: Program) -> list[Path]:
    """The chosen plan to ``out``; with no chosen plan ("all"), every plan into the folder ``out``,
    with the ``program`` they place (as planned: pins included) as :data:`PLANNED_PROGRAM`."""
    try:
        if chosen is not None:
            out.write_text(chosen.to_json())
            return [out]
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / (plan.policy.replace(":", "-") + ".json") for plan in plans]
        for plan, path in zip(plans, paths):
            path.write_text(plan.to_json())
        program.save(out / PLANNED_PROGRAM)
        return paths + [out / PLANNED_PROGRAM]
    except OSError as exc:
        raise UsageError(f"{out}: cannot write ({exc.strerror})") from exc
