"""The placement benchmark's table: measured against predicted, and the issue's three targets, from
the folders ``python -m bench.place_pairs`` wrote (runs anywhere; the committed run is
tests/data/h200-place-pairs):

    python -m bench.place_table [DIR]

Per (target, pair), from its ``disagg.json`` (every strategy behind its gate, timed on one H200):

* **best**: the strategy with the most slots per second, in any slot mode (chained, free,
  scheduled); paced-link rows and the one-slot ablations are not strategies a server would run;
* **chosen**: the strategy the planner's model predicts fastest (least predicted time for the
  slots in flight, among the plans it wrote and the single devices, in every slot mode:
  ``bench.choice``, what ``kernelfleet plan --in-flight`` ranks), and its measured rate against
  the best (target: within 3 %);
* **prediction**: every chained plan row's measured time against its prediction (target: within
  10 %); the worst is named;
* **latency**: the latency plan's measured time per request against the fastest single device's
  (target: at or below it), chained slots (for a single device, one request after another; where
  the plan places every launch on one device, that device's own run: the run times the same graph
  twice, and the two differ by repeat noise alone; a miss there, the other device predicted within
  ``plan.command.NEAR_TIE``, is counted as a tie: which of two devices is faster by less than the
  graph times move between runs is no choice a model can settle); and
  the latency plan today's planner makes from the same program and cost table: its measured time,
  where it is one of the placements the run timed (else "-");
* **placement**: the best kernel placement (pipeline, attention/FFN, latency or throughput plan)
  against request distribution.

A strategy that failed its gate has no time and is never best or chosen. Prints a Markdown table,
the command, and a last line of JSON with every figure. Also committed: the whole table made again
on one H100 (tests/data/h100-place-table, ``bash bench/pending_run.sh place-table``).

``--edges FILE`` (what ``python -m bench.edge_cost`` wrote) fits the per-edge cost of the edge
experiment's plans (``plan/edges.fit``: least squares of their residual, measured - predicted,
against ``--terms``, by default a cost per copy on the critical chain, per wait and per fork across
streams), prints the fit, and re-predicts every row here with it beside today's model. The fit sees
the edge experiment's plans only, never the rows it is counted on; ``--fit-out`` keeps it as a
``kernelfleet_edges`` document. With ``--link`` too (the link the experiment predicted with), the
fit corrects the measured link's predictions instead, and the rows are re-predicted with both.

``--calibrated`` prints instead how many chained rows each correction of the cost table, fitted on
the single-device graphs only, brings within 10 % of its prediction, and what each would choose
(``bench/place_calibration.py``; ``contention`` is the model ``bench disagg`` and ``plan`` use now).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import Parser, command_line, place_calibration
from kernelfleet.bench.choice import PLANS as choice_plans
from kernelfleet.bench.choice import chosen as choice
from kernelfleet.costs.links import LinkTable, describe
from kernelfleet.errors import UsageError
from kernelfleet.plan import command, edges, links
from kernelfleet.plan.contention import Contention
from kernelfleet.plan.edgerun import EdgePlan, EdgeRun
from kernelfleet.plan.model import Plan
from kernelfleet.plan.slots import SUFFIXES

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "h200-place-pairs"
# the plans `kernelfleet plan --policy all` writes, as bench disagg names their chained rows
PLANS = ("single:a", "single:b", *choice_plans)
PLACEMENTS = tuple(p for p in choice_plans if p != "replicas")
MODES = tuple(SUFFIXES.values())
CHOSEN_WITHIN, PREDICTED_WITHIN = 0.03, 0.10


@dataclass(frozen=True)
class Row:
    target: str
    pair: str
    best: str
    best_us: float  # measured µs per slot
    chosen: str
    chosen_us: float
    chosen_over_best: float  # measured time of the chosen / of the best, >= 1
    worst_prediction: str
    worst_prediction_error: float  # measured / predicted - 1, largest in magnitude
    predictions_within: int  # chained plan rows within PREDICTED_WITHIN of their prediction
    predictions: int
    latency_over_single: float  # the latency plan's measured time per request / the fastest single's (where it
    # places every launch on one device, that device's own run: the same graph timed twice differs by noise only)
    replanned_latency: str  # the placement today's latency policy picks, as a timed strategy's name ("-": untimed)
    replanned_over_single: float  # its measured time / the fastest single's (nan where untimed)
    placement_over_replicas: float  # the best placement's rate / request distribution's (> 1: placement wins)
    gates: str  # which gates the timed strategies passed
    refused: int = 0  # chained plan rows not predicted: today's validator refuses their plan (repredicted)
    latency_tie: bool = False  # the latency plan is one device, predicted within command.NEAR_TIE of the other


def row_of(folder: Path, found: dict | None = None) -> Row:
    """The figures of one (target, pair) folder (module docstring); ``found``: its strategies with
    predictions of another model (:func:`repredicted`), else the run's own."""
    found = json.loads((folder / "disagg.json").read_text())["strategies"] if found is None else found
    target, _, pair = folder.name.rpartition(".")
    timed = place_calibration.timed(found)
    if not timed:
        raise ValueError(f"{folder}: no strategy passed its gate")
    best = min(timed, key=timed.get)

    def fastest(plan: str) -> float | None:
        times = [timed[plan + mode] for mode in MODES if plan + mode in timed]
        return min(times) if times else None

    planned = {p: found[p]["predicted_seconds"] for p in PLANS if p in timed and found[p].get("predicted_seconds")}
    chosen = choice(found)
    errors = {p: found[p]["seconds"] / found[p]["predicted_seconds"] - 1 for p in planned}
    worst = max(errors, key=lambda p: abs(errors[p]))
    single = min(t for t in (timed.get("single:a"), timed.get("single:b")) if t)
    placements = [t for t in map(fastest, PLACEMENTS) if t]
    replicas = fastest("replicas")
    gates = sorted({found[n]["gate"].split(":")[0] for n in timed})
    replanned = replanned_latency(folder)
    latency_plan = timed_as(folder, "latency-greedy")
    latency = timed.get(latency_plan) or float("nan")
    alone = [planned[s] for s in ("single:a", "single:b") if s in planned]
    tie = latency_plan.startswith("single:") and len(alone) == 2 and max(alone) / min(alone) - 1 <= command.NEAR_TIE
    return Row(target, pair, best, timed[best] * 1e6, chosen, timed[chosen] * 1e6, timed[chosen] / timed[best],
               worst, errors[worst], sum(abs(e) <= PREDICTED_WITHIN for e in errors.values()), len(errors),
               latency / single, replanned,
               (timed.get(replanned) or float("nan")) / single,
               (replicas / min(placements)) if placements and replicas else float("nan"), ", ".join(gates),
               sum(p in timed and "refused" in found[p] for p in PLANS), tie)


def repredicted(folder: Path, links: LinkTable | None = None, fitted: edges.EdgeFit | None = None) -> dict:
    """The folder's strategies with every slot-mode row's prediction recomputed by today's model
    (``place_calibration``'s ``contention``: the table scaled to its graphs, its shared and free
    factors), copies and waits taken from ``links`` where given (``CostTable.with_links``), plus
    what ``fitted`` charges each graph's edges where given. A row of a plan today's validator refuses
    has no prediction, and says why (``refused``)."""
    found = json.loads((folder / "disagg.json").read_text())["strategies"]
    costs = place_calibration.profiled(folder)
    table = place_calibration.corrected(costs, costs.graph_seconds or place_calibration.graph_seconds(found),
                                        "contention")
    if links is not None:
        table = table.with_links(links.links)
    timed = place_calibration.slot_strategies(folder, table)
    predicted = place_calibration.predictions(folder, table, Contention.of(table, fitted), timed)
    refused = timed[2]
    return {name: {**r, "predicted_seconds": predicted.get(name, r.get("predicted_seconds"))} if name not in refused
            else {**r, "predicted_seconds": None, "refused": refused[name]} for name, r in found.items()}


def replanned_latency(folder: Path) -> str:
    """The strategy of the run whose placement today's latency policy picks from the folder's
    program and cost table ("-" when it picks one the run did not time)."""
    problem = command.setup(folder / "program.json.gz", folder / "costs.json", ["a", "b"], [], links.LINK_GBPS,
                            [], [], None, links.COPY_US).problem
    chosen, _ = command.make_plans(problem, "latency", 10.0)
    return placed_as(folder, chosen.assignment)


def timed_as(folder: Path, policy: str) -> str:
    """The run's strategy timed for the plan ``policy`` of the folder: a single device's own where
    the plan places every launch there, else the plan's."""
    path = folder / f"plan.{policy}.json"
    found = placed_as(folder, Plan.from_json(path.read_text(), str(path)).assignment) if path.is_file() else "-"
    return found if found.startswith("single:") else policy


def placed_as(folder: Path, assignment: list[str]) -> str:
    """The first of the folder's plans (single devices first) that places launches as ``assignment``
    does ("-": none)."""
    files = sorted(folder.glob("plan.*.json"), key=lambda p: (not p.name.startswith("plan.single"), p.name))
    plans = (Plan.from_json(p.read_text(), str(p)) for p in files)  # a single device by its own name
    return next((p.policy for p in plans if p.assignment and p.assignment == assignment), "-")


def markdown(rows: list[Row]) -> str:
    head = ("| target | pair | best (µs/slot) | chosen (µs/slot) | chosen/best | predictions within 10 % "
            "| worst prediction | latency plan / fastest single | re-planned latency plan | placement / replicas "
            "| gates |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r.target} | {r.pair} | {r.best} {r.best_us:.1f} | {r.chosen} {r.chosen_us:.1f} "
                     f"| {r.chosen_over_best:.3f} | {r.predictions_within} of {r.predictions} "
                     f"| {r.worst_prediction} {r.worst_prediction_error:+.1%} | {r.latency_over_single:.2f} "
                     f"| {r.replanned_latency} {r.replanned_over_single:.2f} "
                     f"| {r.placement_over_replicas:.2f} | {r.gates} |")
    return "\n".join(lines)


def verdicts(rows: list[Row]) -> dict[str, str]:
    """Each target of the issue, met or missed with by how much."""
    chosen = [r for r in rows if r.chosen_over_best > 1 + CHOSEN_WITHIN]
    predicted = sum(r.predictions_within for r in rows), sum(r.predictions for r in rows)
    latency = [r for r in rows if not r.latency_over_single <= 1.0]
    ties = sum(r.latency_tie for r in latency)
    tied = (f"; {ties} of them one device, predicted within {command.NEAR_TIE * 100:.0f} % of the other: a tie the "
            "graph times cannot settle") if ties else ""
    replanned = [r for r in rows if not r.replanned_over_single <= 1.0]
    refused = sum(r.refused for r in rows)
    return {
        **({"chained plans today's validator refuses (not predicted)": f"{refused}"} if refused else {}),
        "chosen within 3 % of the best": "met on every row" if not chosen else
        f"missed on {len(chosen)} of {len(rows)} rows (worst {max(r.chosen_over_best for r in chosen) - 1:.1%} "
        "slower than the best)",
        "chained plans within 10 % of prediction": f"{predicted[0]} of {predicted[1]} rows",
        "latency plan at or below the fastest single device": "met on every row" if not latency else
        f"missed on {len(latency)} of {len(rows)} rows (worst {max(r.latency_over_single for r in latency):.3f}x"
        f"{tied})",
        "today's latency plan at or below the fastest single device": "met on every row" if not replanned else
        f"missed or untimed on {len(replanned)} of {len(rows)} rows",
    }


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=RECORDED,
                        help="What bench.place_pairs wrote (default: the committed H200 run).")
    parser.add_argument("--calibrated", action="store_true",
                        help="Predictions recomputed under each correction fitted on the single-device graphs.")
    parser.add_argument("--link", type=Path, help="A measured link (python -m bench.link_cost's links.json): every "
                        "prediction recomputed with it, beside today's model recomputed without it (with --edges: the "
                        "link the experiment predicted with; the fit then corrects its predictions).")
    parser.add_argument("--edges", type=Path, help="An edge experiment (python -m bench.edge_cost's edges.json): "
                        "the per-edge cost fitted on its plans, every prediction here recomputed with it.")
    parser.add_argument("--terms", nargs="+", default=list(edges.DEFAULT_TERMS), choices=edges.TERMS,
                        help="The 1-3 counts the edge fit charges (default: %(default)s).")
    parser.add_argument("--fit-out", type=Path, help="Write the edge fit here (a kernelfleet_edges document).")
    args = parser.parse_args(argv)
    folders = sorted(p.parent for p in args.folder.glob("*/disagg.json"))
    if not folders:
        print(f"bench.place_table: error: no */disagg.json under {args.folder}", file=sys.stderr)
        return 2
    if args.calibrated:
        found = [place_calibration.evaluate(folder) for folder in folders]
        totals = place_calibration.totals(found)
        print(place_calibration.markdown(found), "", *(f"- {k}: {v}" for k, v in totals.items()), "", command_line(),
              sep="\n")
        print(json.dumps({"rows": [asdict(e) for e in found], "totals": totals}))
        return 0
    if args.edges is not None:
        return _with_edges(folders, args.edges, tuple(args.terms), args.fit_out, args.link)
    if args.link is not None:
        return _with_link(folders, args.link)
    rows = [row_of(folder) for folder in folders]
    print(markdown(rows), "", *(f"- {k}: {v}" for k, v in verdicts(rows).items()), "", command_line(), sep="\n")
    print(json.dumps({"rows": [asdict(r) for r in rows], "verdicts": verdicts(rows)}))
    return 0


def _with_link(folders: list[Path], path: Path) -> int:
    """The table re-predicted with the measured link of ``path``, beside today's model recomputed on
    the same folders without it (the baseline of the same run)."""
    try:
        measured = LinkTable.load(path)
    except UsageError as exc:
        print(f"bench.place_table: error: {exc}", file=sys.stderr)
        return 2
    today = [row_of(folder, repredicted(folder)) for folder in folders]
    rows = [row_of(folder, repredicted(folder, measured)) for folder in folders]
    print(f"predictions recomputed with the link of {path} ({measured.source}):",
          *(f"- {describe(link)}" for link in measured.links), "", markdown(rows), "",
          *(f"- {k}: {v}" for k, v in verdicts(rows).items()),
          "", "today's model recomputed on the same folders, without the measured link:",
          *(f"- {k}: {v}" for k, v in verdicts(today).items()), "", command_line(), sep="\n")
    print(json.dumps({"rows": [asdict(r) for r in rows], "verdicts": verdicts(rows),
                      "without_link": verdicts(today)}))
    return 0


def edge_fit(run: EdgeRun, where: Path, terms: tuple[str, ...], with_link: bool = False) -> edges.EdgeFit:
    """The fit of ``terms`` to the residuals of ``run``'s :func:`timed_plans`: measured less today's
    prediction, or less the measured link's (``with_link``)."""
    rows = [(p.counts, p.measured_seconds - baseline(p, with_link)) for p in timed_plans(run)]
    against = f", against the link of {run.link_source}" if with_link else ""
    return edges.fit(rows, terms, f"{where} ({run.source}{against})")


def timed_plans(run: EdgeRun) -> list[EdgePlan]:
    """``run``'s plans that were timed with their own bytes (the zero-byte twins are the bytes'
    control, not plans a server runs)."""
    return [p for p in run.plans if p.measured_seconds is not None and p.copy_cap_bytes is None]


def baseline(plan: EdgePlan, with_link: bool) -> float:
    """The prediction the fit corrects: today's, or with the measured link (UsageError without one)."""
    if not with_link:
        return plan.predicted_seconds
    if plan.predicted_link_seconds is None:
        raise UsageError(f"{plan.target} {plan.name}: no prediction with a measured link recorded")
    return plan.predicted_link_seconds


def bytes_cost(run: EdgeRun) -> list[str]:
    """Per plan with a zero-byte twin: what its copies' bytes cost, measured, per copy."""
    full = {(p.target, p.name): p for p in run.plans if p.copy_cap_bytes is None and p.measured_seconds}
    out = []
    for p in run.plans:
        twin = full.get((p.target, p.name.rsplit(", copies", 1)[0]))
        if p.copy_cap_bytes is not None and twin is not None and p.measured_seconds and twin.counts.copies:
            out.append(f"{p.target} {twin.name}: {twin.counts.copies} copies of {twin.counts.copy_bytes} bytes cost "
                       f"{(twin.measured_seconds - p.measured_seconds) / twin.counts.copies * 1e6:+.2f} µs a copy "
                       f"over copies of {p.copy_cap_bytes} bytes")
    return out


def in_sample(run: EdgeRun, fitted: edges.EdgeFit, with_link: bool = False) -> str:
    """How many of the experiment's own timed plans (their own bytes) the model the fit corrects and
    the fit predict within PREDICTED_WITHIN: in-sample, so a check of the fit's form, not of its use."""
    plans = timed_plans(run)
    base = [baseline(p, with_link) for p in plans]
    before = sum(abs(p.measured_seconds / b - 1) <= PREDICTED_WITHIN for p, b in zip(plans, base))
    after = sum(abs(p.measured_seconds / (b + fitted.seconds(p.counts)) - 1) <= PREDICTED_WITHIN
                for p, b in zip(plans, base))
    model = "the measured link's" if with_link else "today's"
    return (f"on its own {len(plans)} plans (in-sample): {before} within {PREDICTED_WITHIN:.0%} of {model} "
            f"prediction, {after} with the fit")


def _with_edges(folders: list[Path], path: Path, terms: tuple[str, ...], fit_out: Path | None,
                link_path: Path | None = None) -> int:
    """The per-edge fit of the edge experiment ``path``, and the table re-predicted with it beside
    today's model recomputed on the same folders (the baseline of the same run). With ``link_path``
    (the link the experiment predicted with), the fit corrects the measured link's predictions and
    the rows are re-predicted with both."""
    try:
        run = EdgeRun.load(path)
        link = None if link_path is None else LinkTable.load(link_path)
        if link is not None and link.source != run.link_source:
            raise UsageError(f"{path} predicted with the link of {run.link_source!r}, not {link_path}'s "
                             f"({link.source!r}): give the link the experiment used")
        with_link = link is not None
        fitted = edge_fit(run, path, terms, with_link)
        singles = {t: edge_fit(run, path, (t,), with_link) for t in terms} if len(terms) > 1 else {}
    except UsageError as exc:
        print(f"bench.place_table: error: {exc}", file=sys.stderr)
        return 2
    if fit_out is not None:
        fitted.save(fit_out)
    today = [row_of(folder, repredicted(folder)) for folder in folders]
    rows = [row_of(folder, repredicted(folder, link, fitted)) for folder in folders]
    origin = (f"WARNING: {path} is derived from recorded rows, not an edge experiment (rows the counts below "
              "leave out, of the same runs): a test of the mechanics, not a result" if run.derived else
              f"the fit comes from the {fitted.plans} timed plans of {path} only, none of the {len(folders)} rows below")
    print(f"edge fit: {fitted.describe()}", f"fitted on {fitted.fitted_on}", origin, in_sample(run, fitted, with_link),
          *(f"- {t} alone: {f.describe()}" for t, f in singles.items()),
          *(f"- {line}" for line in bytes_cost(run)),
          "", markdown(rows), "", f"with the edge fit{' and the measured link' if with_link else ''}:",
          *(f"- {k}: {v}" for k, v in verdicts(rows).items()),
          "", f"today's model recomputed on the same folders, without {'the link or ' if with_link else ''}the fit:",
          *(f"- {k}: {v}" for k, v in verdicts(today).items()), "", command_line(), sep="\n")
    print(json.dumps({"fit": json.loads(fitted.to_json()), "rows": [asdict(r) for r in rows],
                      "verdicts": verdicts(rows), "without_fit": verdicts(today)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
