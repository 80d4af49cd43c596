"""``kernelfleet bench serve``: online requests at Poisson rates, served by the latency plan, the
throughput plan, request distribution, or the online monitor choosing between the first two —
each request's latency, the SLO capacity of each mode, and a check of every request's outputs.

Three graphs, built and gated as ``bench disagg`` gates (``runtime/gate.py``: every slot through
the validator, outputs bit-identical to each slot's single-device replay), then timed (median of
``repeats`` launches):

* ``latency``: the latency plan (``latency-greedy``), one slot — one request per launch;
* ``throughput``: the throughput plan (``throughput-milp``), ``slots`` slots, slots free (or
  chained, ``throughput_slot_mode="sequential"``) — up to ``slots`` requests per launch;
* ``replicas`` (request distribution, the baseline): ``slots`` slots, each whole on one device,
  split between the devices by their measured single-device rates (as ``bench disagg`` splits
  them), slots free.

A graph that fails the gate is reported and every mode that needs it is not served.

Requests arrive at pre-drawn Poisson times and are served by the real-time serving loop
(``runtime/serving.py``), which ``slot use`` reports the wasted slots of. After every launch the
served slots' outputs must still equal their references (the step must be idempotent, as a
prefill is); a request whose outputs differ is counted corrupted, and the outputs are zeroed again
so the next launch has to rewrite them. When the arrival window closes the queue is drained;
``dropped`` = arrivals − served, zero unless a request was lost. The GPU part is
:func:`bench_serve`; the rest runs on the CPU (tests/unit/test_serve.py).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from itertools import takewhile
from pathlib import Path
from typing import Any

from kernelfleet.errors import UsageError
from kernelfleet.runtime.monitor import LATENCY, THROUGHPUT, Monitor
from kernelfleet.runtime.serving import Run, serve
from kernelfleet.workloads.requests import fixed, poisson_requests

REPLICAS, MONITOR = "replicas", "monitor"
MODES = (LATENCY, THROUGHPUT, REPLICAS, MONITOR)
NEEDS = {LATENCY: (LATENCY,), THROUGHPUT: (THROUGHPUT,), REPLICAS: (REPLICAS,), MONITOR: (LATENCY, THROUGHPUT)}
PLANS = {LATENCY: "latency-greedy", THROUGHPUT: "throughput-milp"}  # policy names `kernelfleet plan` writes
SLOT_MODES = ("free", "sequential")  # for the throughput graph (plan/slots.py; "scheduled" needs costs)


def parse_rates(text: str) -> list[float]:
    """``"2,4,6"`` → [2.0, 4.0, 6.0]: offered requests per second, each > 0."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--rates wants requests/s separated by commas, e.g. 2,4,6; got {text!r}") from None
    if not rates or not all(r > 0 and math.isfinite(r) for r in rates):
        raise UsageError(f"--rates wants one or more positive requests/s separated by commas, e.g. 2,4,6; got {text!r}")
    return rates


def arrival_times(rate_per_second: float, seconds: float, seed: int = 0) -> list[float]:
    """Arrival times in [0, ``seconds``] of a Poisson process (``workloads.requests``). One seed
    at every rate gives one pattern, compressed: the gaps are the same exponential draws divided by
    the rate, so a higher rate never has fewer arrivals in the window."""
    stream = poisson_requests(rate_per_second, sys.maxsize, fixed(1), fixed(1), 1, seed)
    return [r.arrival_seconds for r in takewhile(lambda r: r.arrival_seconds <= seconds, stream)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in (0, 100]): a value that occurred; the maximum for p99 of
    fewer than 100 values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(run: Run, rate_per_second: float, mode: str, arrival_window_seconds: float) -> dict:
    """One row of the table: what happened to the requests of one (rate, mode) whose arrivals came
    in the first ``arrival_window_seconds``."""
    latencies = [s.latency_seconds for s in run.served]
    last = max((s.done_seconds for s in run.served), default=None)
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    return {"rate_per_second": rate_per_second, "mode": mode, "arrivals": run.arrivals, "served": len(run.served),
            "dropped": run.arrivals - len(run.served), "corrupted": run.corrupted,
            "p50_ms": None if p50 is None else p50 * 1e3, "p99_ms": None if p99 is None else p99 * 1e3,
            "requests_per_second": len(run.served) / last if last else None,  # from the window's start
            "switches": run.switches, "launches": run.launches,
            "slot_use_ratio": len(run.served) / run.slots_run if run.slots_run else None,
            "drain_seconds": max(0.0, last - arrival_window_seconds) if last is not None else 0.0}


def slo_capacity(rows: list[dict], slo_ms: float) -> dict[str, float | None]:
    """Per mode, the highest offered rate whose p99 latency is within ``slo_ms`` with nothing
    dropped or corrupted; None where no rate is."""
    capacity: dict[str, float | None] = {}
    for row in rows:
        capacity.setdefault(row["mode"], None)
        ok = (row.get("p99_ms") is not None and row["p99_ms"] <= slo_ms and row.get("dropped") == 0
              and row.get("corrupted") == 0)
        if ok and (capacity[row["mode"]] is None or row["rate_per_second"] > capacity[row["mode"]]):
            capacity[row["mode"]] = row["rate_per_second"]
    return capacity


def sweep(rates: list[float], seconds: float, graphs: dict[str, int], run_mode: Callable[[str, list[float]], Run],
          seed: int = 0, done: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Every mode at every rate, every mode of a rate on the same arrivals; a mode missing one of
    its graphs (failed the gate) is a row that says so. ``done(rows)`` after every row."""
    rows = []
    for rate in rates:
        arrivals = arrival_times(rate, seconds, seed)
        for mode in MODES:
            missing = [g for g in NEEDS[mode] if g not in graphs]
            if missing:
                rows.append({"rate_per_second": rate, "mode": mode, "arrivals": len(arrivals),
                             "not_served": f"the {', '.join(missing)} graph failed the gate"})
            else:
                rows.append(summary(run_mode(mode, arrivals), rate, mode, seconds))
            done(rows)
    return rows


def bench_serve(make_step: Callable[[str, int], Any], profiles: dict, plans: Path, slots: int, rates: list[float],
                seconds: float, slo_ms: float, window_seconds: float, beta: float, repeats: int, out: Path,
                console: Any, seed: int = 0, throughput_slot_mode: str = "free") -> dict:
    """Capture, gate and time the three graphs, serve every rate in every mode, write serve.json;
    return the results (module docstring). Runs on the GPUs of ``profiles``."""
    import time

    import torch

    from kernelfleet.bench.disagg import Strategy, measure, strategies
    from kernelfleet.profile.timing import median_seconds
    from kernelfleet.runtime import plans as runtime_plans
    from kernelfleet.runtime.executor import release, run
    from kernelfleet.runtime.gate import Gate, passed

    if slots < 2:
        raise UsageError(f"--slots must be at least 2 (request distribution needs one per device), got {slots}")
    if throughput_slot_mode not in SLOT_MODES:
        raise UsageError(f"--throughput-slots: expected {' or '.join(SLOT_MODES)}, got {throughput_slot_mode!r}")
    out.mkdir(parents=True, exist_ok=True)
    gate = Gate(make_step, profiles, slots)
    loaded = runtime_plans.load(plans, gate.problem)
    for policy in PLANS.values():
        if policy not in loaded:
            raise UsageError(f"{plans}: no {policy} plan (write them with `kernelfleet plan PROGRAM COSTS "
                             f"--policy all --out {plans}`)")
    results: dict = {"command": shlex.join(["kernelfleet", *sys.argv[1:]]), "slots": slots, "rates": rates, "seed": seed,
                     "seconds": seconds, "slo_ms": slo_ms, "window_ms": window_seconds * 1e3, "beta": beta,
                     "devices": {name: asdict(spec) for name, spec in profiles.items()}, "graphs": {}}

    def write() -> None:  # after every step, so a run cut short keeps what it measured
        (out / "serve.json").write_text(json.dumps(results, indent=1, default=str))

    stream = torch.cuda.Stream(device=profiles[gate.devices[0]].device)
    n, built = len(gate.program.launches), {}
    homes: dict[str, list[str]] = {}
    try:
        with gate:
            singles = {s.name: measure(gate, s, repeats, stream) for s in strategies(loaded, gate.devices, slots, None, n)}
            rates_single = {d: singles[f"single:{d}"].get("slots_per_second") for d in gate.devices}
            results["single_devices"] = singles
            split = "by the measured single-device rates"
            if None in rates_single.values():
                rates_single, split = {d: 1.0 for d in gate.devices}, "evenly (a single device failed the gate)"
            latency, throughput = loaded[PLANS[LATENCY]], loaded[PLANS[THROUGHPUT]]
            todo = {
                LATENCY: Strategy("latency-greedy, 1 slot", [latency.assignment],
                                  [latency.details.home or gate.devices[0]]),
                THROUGHPUT: Strategy(f"throughput-milp, slots {throughput_slot_mode}", [throughput.assignment] * slots,
                                     [throughput.details.home or gate.devices[0]] * slots,
                                     {"slot_mode": throughput_slot_mode}),
                REPLICAS: next(s for s in strategies(loaded, gate.devices, slots, rates_single, n)
                               if s.name == "replicas, slots free"),
            }
            for g, s in todo.items():
                found: dict = {"strategy": s.name, "homes": s.homes}
                try:
                    graph = gate.graph(s.name, s.assignments, s.homes, **s.options)
                except Exception as exc:  # a plan the replicas cannot run is reported, never served
                    found["gate"] = f"refused: {exc}"
                else:
                    try:
                        found["gate"] = gate.gate(graph, s.homes, stream)
                    except Exception as exc:
                        found["gate"] = f"refused: {exc}"
                    if passed(found["gate"]):
                        built[g], homes[g] = graph, s.homes
                        found["seconds"] = median_seconds(lambda: run(graph, stream.cuda_stream), stream, repeats)
                        found["requests_per_second"] = len(s.homes) / found["seconds"]
                    else:
                        release(graph)
                if g == REPLICAS:
                    found["split"] = split
                results["graphs"][g] = found
                write()
            per_launch = {g: len(homes[g]) for g in built}

            def launch(g: str, _: int) -> None:
                run(built[g], stream.cuda_stream)
                stream.synchronize()

            def check(g: str, count: int) -> int:
                served = homes[g][:count]
                bad = len(gate.differing(served))  # slots whose outputs are not their references'
                gate.clear_outputs(served)
                return bad

            def run_mode(mode: str, arrivals: list[float]) -> Run:
                for h in homes.values():  # zeroed: the first launch of the run has to write them
                    gate.clear_outputs(h)
                capacity = results["graphs"][LATENCY].get("requests_per_second")
                monitor = Monitor(window_seconds, beta, LATENCY, latency_capacity=capacity) if mode == MONITOR else None
                return serve(arrivals, per_launch, launch, check, time.perf_counter, time.sleep,
                             graph=None if monitor else mode, monitor=monitor)

            def done(rows: list[dict]) -> None:
                results["runs"] = rows
                write()
                r = rows[-1]
                console.print(f"{r['rate_per_second']:g} req/s, {r['mode']}: " + (
                    r["not_served"] if "not_served" in r else
                    f"{r['served']}/{r['arrivals']} served, p99 {r['p99_ms'] or 0:.0f} ms, {r['corrupted']} corrupted"),
                    markup=False, highlight=False)

            results["runs"] = sweep(rates, seconds, per_launch, run_mode, seed, done)
    finally:
        for graph in built.values():
            release(graph)
    results["slo_capacity"] = slo_capacity([r for r in results["runs"] if "not_served" not in r], slo_ms)
    results["corrupted"] = sum(r.get("corrupted", 0) for r in results["runs"])
    write()
    show(results, console)
    return results


def show(results: dict, console: Any) -> None:
    """The table of every (rate, mode), each mode's SLO capacity, and the command."""
    from rich.table import Table

    table = Table(title=f"kernelfleet bench serve — {results['slots']} slots, SLO p99 ≤ {results['slo_ms']:g} ms, "
                        f"{results['seconds']:g} s of arrivals per rate")
    for column in ("req/s offered", "mode", "served", "dropped", "corrupted", "p50 ms", "p99 ms", "req/s achieved",
                   "switches", "slot use", "drain s"):
        table.add_column(column)

    def number(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    for r in results["runs"]:
        if "not_served" in r:
            table.add_row(f"{r['rate_per_second']:g}", r["mode"], "-", "-", "-", "-", "-", "-", "-", "-",
                          r["not_served"])
            continue
        bad = r["corrupted"] or r["dropped"]
        table.add_row(f"{r['rate_per_second']:g}", r["mode"], str(r["served"]),
                      f"[red]{r['dropped']}[/]" if r["dropped"] else "0",
                      f"[red]{r['corrupted']}[/]" if r["corrupted"] else "0",
                      number(r["p50_ms"], ".1f"), number(r["p99_ms"], ".1f"), number(r["requests_per_second"], ".2f"),
                      "-" if r["switches"] is None else str(r["switches"]), number(r["slot_use_ratio"], ".0%"),
                      f"{r['drain_seconds']:.2f}", style="red" if bad else None)
    console.print(table)
    for g, found in results["graphs"].items():
        rate = found.get("requests_per_second")
        console.print(f"{g} graph ({found['strategy']}): {found['gate'][:80]}"
                      + (f", {found['seconds'] * 1e3:.1f} ms per launch, {rate:.2f} requests/s" if rate else "")
                      + (f"; slots split {found['split']}" if "split" in found else ""), markup=False, highlight=False)
    console.print("SLO capacity (highest offered rate with p99 within the SLO, nothing dropped or corrupted): "
                  + ", ".join(f"{m} {'-' if c is None else f'{c:g} req/s'}" for m, c in results["slo_capacity"].items()),
                  markup=False, highlight=False)
    if results["corrupted"]:
        console.print(f"[red]{results['corrupted']} requests came back with outputs that differ from their "
                      "references[/]")
    console.print(f"command: {results['command']}", markup=False, highlight=False)
