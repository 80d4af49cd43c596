"""``kernelfleet``: one command, with sub-commands."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live

from kernelfleet import cli_place
from kernelfleet.cli_common import CatalogOption, err, out_console
from kernelfleet.documents import read_text
from kernelfleet.errors import EnvironmentProblem, KernelfleetError, UsageError

app = typer.Typer(
    help="See how well every GPU uses its tensor cores (OFU), and place models across GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ReplayOption = typer.Option(None, "--replay", help="Read a recorded trace instead of the GPUs.")
IntervalOption = typer.Option(1.0, "--interval", help="Window length in seconds (>= 0.1).")
ClockPollOption = typer.Option(
    0.1, "--clock-poll", help="Seconds between SM clock reads inside a window (docs/telemetry.md: accuracy vs CPU)."
)
DenseClockOption = typer.Option(
    False, "--dense-clock", help="Read the SM clock every --clock-poll seconds even while every GPU's clock holds still "
    "(default: then once a window)."
)
DemoOption = typer.Option(False, "--demo", help="Use the bundled H200 recording, in a loop.")
SpeedOption = typer.Option(1.0, help="Replay speed (1 = as recorded).")


DEMO_TRACE = Path(__file__).parent / "data" / "demo-h200.jsonl.gz"


def _source(replay: Path | None, demo: bool, interval: float, clock_poll: float, speed: float | None, loop: bool,
            dense_clock: bool = False):
    from kernelfleet.telemetry.nvml import NvmlSource
    from kernelfleet.telemetry.replay import ReplaySource

    if replay is not None and demo:
        raise UsageError("give --replay FILE or --demo, not both")
    if demo:
        return ReplaySource(DEMO_TRACE, speed=speed, loop=loop, rebase_time=True)
    if replay is not None:
        return ReplaySource(replay, speed=speed, loop=loop)
    return NvmlSource(interval_seconds=interval, clock_poll_seconds=clock_poll, adaptive_clock_poll=not dense_clock)


@app.command()
def watch(
    replay: Path | None = ReplayOption,
    demo: bool = DemoOption,
    interval: float = IntervalOption,
    clock_poll: float = ClockPollOption,
    dense_clock: bool = DenseClockOption,
    speed: float = SpeedOption,
    once: bool = typer.Option(False, "--once", help="Show one window and exit."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    catalog: Path | None = CatalogOption,
) -> None:
    """Live OFU for every GPU, refreshed every window."""
    from kernelfleet.catalog import Catalog
    from kernelfleet.watch import rows, table

    cat = Catalog.load(catalog)
    # A pipe or file gets the full table, not one squeezed to 80 columns.
    out = out_console()
    title = "demo (H200 recording)" if demo else f"replay of {replay.name}" if replay else "live"
    with _source(replay, demo, interval, clock_poll, None if once else speed, loop=demo and not once,
                 dense_clock=dense_clock) as source:
        batches = source.batches(count=1 if once else None)
        if once or as_json:
            for batch in batches:
                view = rows(batch, cat)
                if as_json:
                    print(json.dumps(view), flush=True)
                else:
                    out.print(table(view, _title(title)))
            return
        with Live(console=out, auto_refresh=False) as live:
            for batch in batches:
                live.update(table(rows(batch, cat), _title(title)), refresh=True)


def _title(where: str) -> str:
    return f"kernelfleet watch — {where} — {time.strftime('%H:%M:%S')}"


@app.command()
def record(
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write (.jsonl or .jsonl.gz)."),
    interval: float = IntervalOption,
    clock_poll: float = ClockPollOption,
    dense_clock: bool = DenseClockOption,
    duration: float | None = typer.Option(None, help="Stop after this many seconds."),
    note: str = typer.Option("", help="Free text stored in the trace header."),
) -> None:
    """Record samples from the GPUs to a trace file, as they are read."""
    from kernelfleet.telemetry.replay import TraceWriter

    count = None if duration is None else max(1, round(duration / interval))
    source = _source(None, False, interval, clock_poll, None, loop=False, dense_clock=dense_clock)
    with source, TraceWriter(output, note=note) as writer:
        try:
            with err.status(f"recording to {output}") as status:
                for batch in source.batches(count=count):
                    writer.write(batch)
                    status.update(f"recording to {output}: {writer.batches} windows")
        except KeyboardInterrupt:
            pass
    err.print(f"wrote {writer.batches} windows to {output}")


@app.command()
def agent(
    replay: Path | None = ReplayOption,
    demo: bool = DemoOption,
    interval: float | None = typer.Option(
        None, "--interval", help="Window length in seconds (default 1; 30 with --scrape)."
    ),
    clock_poll: float = ClockPollOption,
    dense_clock: bool = DenseClockOption,
    speed: float = SpeedOption,
    store_path: Path = typer.Option(Path("kernelfleet.db"), "--store", help="SQLite file of the embedded store."),
    listen: str = typer.Option("127.0.0.1:9400", help="HOST:PORT for /metrics and the API."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback listen address."),
    token: str | None = typer.Option(None, envvar="KERNELFLEET_TOKEN", help="Require this bearer token."),
    scrape: str | None = typer.Option(None, "--scrape", help="Read a dcgm-exporter /metrics URL instead of NVML."),
    catalog: Path | None = CatalogOption,
) -> None:
    """Sample every GPU each window, store it, and serve Prometheus metrics and the API."""
    import threading

    from kernelfleet.catalog import Catalog
    from kernelfleet.fleet.agent import Agent, attribute_live, attribute_recorded
    from kernelfleet.fleet.listener import Listener, bind, given_token, listen_address
    from kernelfleet.fleet.server import agent_app
    from kernelfleet.fleet.store import Store
    from kernelfleet.telemetry.scrape import ScrapeSource

    token = given_token(token)
    host, port = listen_address(listen, allow_remote, token)
    if scrape is not None and (replay is not None or demo):
        raise UsageError("give one source: --scrape URL, --replay FILE or --demo")
    cat = Catalog.load(catalog)
    if scrape is not None:
        # dcgm-exporter refreshes its fields every 30 s by default: scraping faster reads the same values.
        source = ScrapeSource(scrape, interval_seconds=interval or 30.0)
    else:
        source = _source(replay, demo, interval or 1.0, clock_poll, speed, loop=demo, dense_clock=dense_clock)
    recorded = replay is not None or demo
    sock = bind(host, port)  # before the store and the first window: a clash exits now, not after a banner
    try:
        store = Store(store_path, writer=True)
    except BaseException:
        sock.close()
        raise
    with source:
        the_agent = Agent(source, store, cat, identify=attribute_recorded if recorded else attribute_live,
                          pods=(lambda: source.pods) if scrape is not None else None,
                          hosts=(lambda: source.hosts) if scrape is not None else None)
        server = Listener(agent_app(the_agent, store, token), sock).start()
        err.print(f"kernelfleet agent: http://{host}:{port}/metrics, store {store_path}")
        stop = threading.Event()
        server.stops(stop)
        try:
            the_agent.run(stop)
        except KeyboardInterrupt:
            pass
        finally:
            died = not server.alive()
            server.stop()
            store.close()
        if died:
            raise EnvironmentProblem(f"the HTTP server on {host}:{port} stopped; the agent stops with it (see its log above)")


@app.command()
def dashboard(
    prometheus: str = typer.Option(..., "--prometheus", help="URL of a Prometheus server that scrapes the agents."),
    listen: str = typer.Option("127.0.0.1:9401", help="HOST:PORT for the dashboard and its API."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback listen address."),
    token: str | None = typer.Option(None, envvar="KERNELFLEET_TOKEN", help="Require this bearer token."),
) -> None:
    """The dashboard for a whole fleet, reading a Prometheus server instead of one agent's store."""
    import threading

    from kernelfleet.fleet.listener import Listener, bind, given_token, listen_address
    from kernelfleet.fleet.prometheus_backend import PrometheusBackend
    from kernelfleet.fleet.server import create_app

    token = given_token(token)
    host, port = listen_address(listen, allow_remote, token)
    backend = PrometheusBackend(prometheus)
    backend.health()  # an unreachable Prometheus is one clear line now, not an error page later
    server = Listener(create_app(backend, token), bind(host, port)).start()
    err.print(f"kernelfleet dashboard: http://{host}:{port}/ reading {prometheus}")
    stop = threading.Event()
    server.stops(stop)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@app.command()
def job(
    name: str | None = typer.Argument(None, help="The job id (omit to list the jobs in the store)."),
    store_path: Path = typer.Option(Path("kernelfleet.db"), "--store", help="The agent's SQLite store."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """A job's report: OFU per GPU over its lifetime, timeline, bottleneck classes, regressions."""
    from rich.table import Table

    from kernelfleet.fleet.store import Store

    if not store_path.exists():
        raise UsageError(f"{store_path}: no such store (the agent writes one with --store)")
    store = Store(store_path)
    if name is None:
        names = store.jobs()
        print(json.dumps(names) if as_json else "\n".join(names) or "no jobs recorded yet")
        return
    report = store.job_report(name)
    if report is None:
        known = ", ".join(store.jobs()[:10]) or "none"
        raise UsageError(f"no job {name!r} in {store_path} (known: {known})")
    if as_json:
        print(json.dumps(report, indent=1))
        return
    out = Console()
    out.print(f"[bold]{report['job']}[/] ({report['kind']}, user {report['user'] or '?'}) "
              f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(report['first_seen']))} → "
              f"{time.strftime('%H:%M:%S', time.localtime(report['last_seen']))}")
    t = Table("host", "GPU", "model", "OFU", "seconds", "share", "note")
    for g in report["gpus"]:
        ofu = "—" if g["ofu_ratio"] is None else f"{100 * g['ofu_ratio']:.1f}%"
        t.add_row(g["host"], str(g["gpu_index"]), g["name"], ofu, f"{g['seconds']:.0f}", f"{g['mean_share']:.2f}",
                  "shared: approximate" if g["approximate"] else "")
    out.print(t)
    total = sum(report["bottleneck_seconds"].values()) or 1.0
    out.print("bottlenecks: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in report["bottleneck_seconds"].items()))
    bars = " ▁▂▃▄▅▆▇█"
    line = "".join(bars[min(8, int((p["ofu_ratio"] or 0) * 8 / 0.8))] for p in report["timeline_1m"])
    out.print(f"OFU per minute: {line}")
    for e in report["events"]:
        out.print(f"[red]{e['kind']}[/] {time.strftime('%H:%M:%S', time.localtime(e['ts']))}: {e['detail']}")


bench_app = typer.Typer(help="Benchmarks (the GEMM sweep needs an NVIDIA GPU and torch).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("ofu")
def bench_ofu(
    out: Path = typer.Option(..., "--out", help="Folder for sweep-points.jsonl.gz and sweep-trace.jsonl.gz."),
    seconds: float = typer.Option(3.3, help="Seconds of timed GEMMs per point."),
    budget: float = typer.Option(330.0, help="Stop starting new points after this many seconds."),
) -> None:
    """Sweep GEMM shapes and precisions, timing MFU with CUDA events while recording the counters."""
    try:
        import torch
    except ImportError as exc:
        raise EnvironmentProblem("the GEMM sweep needs torch: pip install 'kernelfleet[place]'") from exc
    if not torch.cuda.is_available():
        raise EnvironmentProblem("the GEMM sweep needs an NVIDIA GPU; `kernelfleet bench ofu-report DIR` reads a recorded sweep")
    from kernelfleet.bench.ofu_sweep import sweep

    err.print(f"{sweep(out, seconds, budget)} points written to {out}")


@bench_app.command("ofu-report")
def bench_ofu_report(
    sweep_dir: Path = typer.Argument(..., help="A folder written by `kernelfleet bench ofu`."),
    ncu: Path | None = typer.Option(None, "--ncu", help="A folder with ncu-sweep.csv[.gz] and "
                                    "ncu-sweep-points.jsonl from bench/ncu_sweep.sh (and, if there, a re-run as "
                                    "ncu-rerun.csv[.gz] and ncu-rerun-points.jsonl): adds the Nsight Compute check."),
    clock: Path | None = typer.Option(None, "--clock", help="A folder from bench/ofu_clock_check.py: adds the "
                                      "clock check and its verdict (docs/validation/ofu.md)."),
    catalog: Path | None = CatalogOption,
) -> None:
    """The paper's Table II (raw and tile-corrected OFU against MFU) from a recorded sweep."""
    import gzip

    from kernelfleet.catalog import Catalog
    from kernelfleet.ofu.validation import gemm_points
    from kernelfleet.telemetry.replay import ReplaySource

    points_file = sweep_dir / "sweep-points.jsonl.gz"
    if not points_file.exists():
        raise UsageError(f"{points_file}: no such file (write one with `kernelfleet bench ofu --out {sweep_dir}`)")
    try:
        with gzip.open(points_file, "rt") as f:
            points = [json.loads(line) for line in f]
    except (OSError, ValueError) as exc:
        raise UsageError(f"{points_file}: corrupt or truncated ({exc})") from exc
    samples = [b[0] for b in ReplaySource(sweep_dir / "sweep-trace.jsonl.gz").batches()]
    if not samples:
        raise UsageError(f"{sweep_dir}: the counter trace has no windows")
    cat = Catalog.load(catalog)
    sku = cat.lookup(samples[0].name, samples[0].pci_device_id)
    if sku is None:
        raise UsageError(f"{samples[0].name} is not in the catalog: no peak to measure MFU against")
    _print_table_ii(gemm_points(points, samples, sku), sku)
    if ncu is not None:
        _print_ncu_check(ncu, points, samples, sku)
    if clock is not None:
        _print_clock_check(clock, cat)


def _print_table_ii(gemm, sku) -> None:
    """Table II, the f_ref each precision was normalised by, the targets, and an in-sample fit beside."""
    from kernelfleet.ofu.validation import PEAK_OF, TARGET_MAE_PP, centred, summarize_errors

    def table(rows) -> None:
        print("| precision | points | raw MAE (pp) | raw ≤2 pp | raw ≤5 pp | corrected MAE (pp) | corrected ≤2 pp | "
              "corrected ≤5 pp |")
        print("|---|---|---|---|---|---|---|---|")
        for s in rows:
            print(f"| {s.precision} | {s.points} | {s.raw_mae_pp:.2f} | {s.raw_within_2pp:.0%} | {s.raw_within_5pp:.0%} | "
                  f"{s.corrected_mae_pp:.2f} | {s.corrected_within_2pp:.0%} | {s.corrected_within_5pp:.0%} |")

    rows = summarize_errors(gemm)
    table(rows)
    refs = {s.precision: sku.ofu_reference_clock_of(PEAK_OF[s.precision]) for s in rows}
    print("\nf_ref: " + ", ".join(
        f"{q} {hz / 1e6:.0f} MHz ({basis}: {sku.peak_clock(PEAK_OF[q]) / 1e6:.0f} MHz"
        + (f" / {sku.peak_clock(PEAK_OF[q]) / hz:.3f})" if basis == "measured" else ")") for q, (hz, basis) in refs.items()))
    for s in rows:
        if s.precision in TARGET_MAE_PP:
            target, miss = TARGET_MAE_PP[s.precision], s.corrected_mae_pp - TARGET_MAE_PP[s.precision]
            verdict = f"met ({-miss:.2f} pp to spare)" if miss <= 0 else f"missed by {miss:.2f} pp"
            print(f"target {s.precision}: corrected MAE {s.corrected_mae_pp:.2f} ≤ {target:g} pp: {verdict}")
    print("\nIn-sample, for comparison only (each precision's f_ref fitted so its corrected errors average zero):")
    fits = {q: centred([p for p in gemm if p.precision == q]) for q in refs}
    print("fitted f_ref: " + ", ".join(f"{q} {refs[q][0] / factor / 1e6:.0f} MHz" for q, (factor, _) in fits.items()))
    table(summarize_errors([p for _, moved in fits.values() for p in moved]))


def _ncu_runs(folder: Path) -> list[tuple[str, list[dict]]]:
    """(CSV text, launch order) of each ncu run in the folder: ncu-sweep, then ncu-rerun if present."""
    runs = []
    for stem in ("ncu-sweep", "ncu-rerun"):
        csv_file = next((f for f in (folder / f"{stem}.csv.gz", folder / f"{stem}.csv") if f.exists()), None)
        order_file = folder / f"{stem}-points.jsonl"
        if csv_file is None or not order_file.exists():
            continue
        try:
            text = read_text(csv_file)
            order = _read_jsonl(order_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{folder}: unreadable ncu output {csv_file.name} ({exc})") from exc
        runs.append((text, order))
    if not runs:
        raise UsageError(f"{folder}: expected ncu-sweep.csv[.gz] and ncu-sweep-points.jsonl (bash bench/ncu_sweep.sh)")
    return runs


def _print_ncu_check(folder: Path, points: list[dict], samples: list, sku) -> None:
    """The Nsight Compute section of `bench ofu-report` (docs/validation/ofu.md)."""
    from kernelfleet.ofu.ncu import clock_checks, merge_runs, ncu_points, parse_ncu_csv, summarize

    runs = _ncu_runs(folder)
    profiled = merge_runs(*(ncu_points(order, points, parse_ncu_csv(text), sku.sm_count) for text, order in runs))
    checks = clock_checks(points, samples, sku, profiled)
    mhz = lambda hz: f"{hz / 1e6:.0f}"  # noqa: E731
    print(f"\nNsight Compute: {len(profiled)} of {len(points)} sweep kernels profiled"
          + (f" ({len(runs)} runs; a later run's point replaces an earlier one's)" if len(runs) > 1 else ""))
    print("| precision | profiled | executed ops = name model | FLOP per active cycle per SM | mean ncu active | "
          "mean GPM active | f_true/f_nvml mean (min–max) | corrected MAE, counted ops (pp) |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summarize(profiled, checks, sku.sm_count):
        same = (f"{s.ops_equal_name}/{s.ops_counted} ({s.ops_equal_tile_only}/{s.ops_counted} without clusters)"
                if s.ops_counted else "not counted")
        rate = "—" if s.flops_per_active_cycle is None else f"{s.flops_per_active_cycle:.0f} {s.rate_basis}"
        ratio = "—" if s.mean_clock_ratio is None else f"{s.mean_clock_ratio:.3f} ({s.min_clock_ratio:.3f}–{s.max_clock_ratio:.3f})"
        gpm = "—" if s.mean_gpm_active_ratio is None else f"{s.mean_gpm_active_ratio:.3f}"
        mae = "—" if s.corrected_mae_pp is None else f"{s.corrected_mae_pp:.2f}"
        print(f"| {s.precision} | {s.profiled} | {same} | {rate} | {s.mean_ncu_active_ratio:.3f} | {gpm} | {ratio} | {mae} |")
    print("\n| precision | M×N×K | ncu ops = name | ncu active | GPM active | NVML MHz | f_true MHz | f_true/f_nvml | "
          "ncu clock MHz |")
    print("|---|---|---|---|---|---|---|---|---|")
    by_shape = {(p.precision, p.m, p.n, p.k): p for p in profiled}
    for c in checks:
        p = by_shape[c.precision, c.m, c.n, c.k]
        same = {None: "—", True: "yes", False: "no"}[p.ops_equal_name]
        print(f"| {c.precision} | {c.m}×{c.n}×{c.k} | {same} | {c.ncu_active_ratio:.3f} | {c.gpm_tensor_active_ratio:.3f} | "
              f"{mhz(c.nvml_sm_clock_hertz)} | {mhz(c.implied_sm_clock_hertz)} | {c.clock_ratio:.3f} | {mhz(p.sm_clock_hertz)} |")


def _read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in read_text(path).splitlines() if line.strip()]


def _print_clock_check(folder: Path, cat) -> None:
    """The clock section of `bench ofu-report` (bench/ofu_clock_check.py; docs/validation/ofu.md)."""
    from kernelfleet.ofu import clock_check
    from kernelfleet.ofu.ncu import parse_ncu_csv
    from kernelfleet.telemetry.replay import ReplaySource

    need = [folder / name for name in ("clock-loop.jsonl.gz", "clock-trace.jsonl.gz", "nvml-clock-loop.jsonl.gz")]
    if not all(f.exists() for f in need):
        raise UsageError(f"{folder}: expected {', '.join(f.name for f in need)} (python3 bench/ofu_clock_check.py loop)")
    try:
        lines, reads = _read_jsonl(need[0]), _read_jsonl(need[2])
        samples = [b[0] for b in ReplaySource(need[1]).batches()]
        launches_file = folder / "ncu-clock-launches.jsonl"
        csv_file = next((f for f in (folder / "ncu-clock.csv.gz", folder / "ncu-clock.csv") if f.exists()), None)
        launches = _read_jsonl(launches_file) if launches_file.exists() else []
        csv_text = read_text(csv_file) if launches and csv_file is not None else ""
        kernels = parse_ncu_csv(csv_text) if csv_text else []
        ncu_reads = _read_jsonl(folder / "nvml-clock-ncu.jsonl.gz") if launches else []
    except (OSError, ValueError, EOFError) as exc:  # EOFError: a .gz cut short by a killed writer
        raise UsageError(f"{folder}: unreadable clock-check output ({exc})") from exc
    if not samples:
        raise UsageError(f"{need[1]}: the counter trace has no windows")
    sku = cat.lookup(samples[0].name, samples[0].pci_device_id)
    if sku is None:
        raise UsageError(f"{samples[0].name} is not in the catalog: no peak to measure FLOP/s against")
    loops = clock_check.loop_clocks(lines, samples, reads, sku)
    try:
        ncu = clock_check.ncu_clocks(launches, kernels, ncu_reads) if launches else []
    except UsageError as exc:  # the loops still decide with the probe
        print(f"\nClock check: the ncu half is left out: {exc}")
        ncu = []
    ratios = clock_check.loop_cycle_ratios(loops, ncu)
    mhz = lambda hz: "—" if hz is None else f"{hz / 1e6:.0f}"  # noqa: E731
    r3 = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
    share = lambda x: "—" if x is None else f"{x:.0%}"  # noqa: E731
    print(f"\nClock check: {len(loops)} loops, {len(ncu)} launches under ncu")
    same = clock_check.ncu_over_probe_at_the_same_clock(loops, ncu)
    print("| precision | M×N×K | path | windows (probed) | MFU | GPM active | NVML MHz | f_true MHz | probe MHz | "
          "f_true/NVML | probe/NVML | GPM/math | ncu cycles ÷ loop time ÷ NVML | ncu/probe, same clock | power-capped | "
          "HW slowdown |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in loops:
        key = (c.precision, c.m, c.n, c.k)
        shape = f"{c.m}×{c.n}×{c.k}" + (f" + {c.filler_launches} adds" if c.filler_launches else "")
        print(f"| {c.precision} | {shape} | {c.path} | {c.windows} ({c.probe_windows}) | {c.mfu_ratio:.3f} | "
              f"{c.gpm_tensor_active_ratio:.3f} | {mhz(c.nvml_sm_clock_hertz)} | {mhz(c.implied_sm_clock_hertz)} | "
              f"{mhz(c.probe_sm_clock_hertz)} | {c.true_over_nvml:.3f} | {r3(c.probe_over_nvml)} | {r3(c.gpm_over_math)} | "
              f"{r3(ratios.get(key))} | {r3(same.get(key))} | {share(c.power_capped_ratio)} | "
              f"{share(c.hw_slowdown_ratio)} |")
    if ncu:
        print("\n| precision | M×N×K | path | duration µs | ncu MHz | NVML MHz (reads) | NVML min MHz | ncu/NVML |")
        print("|---|---|---|---|---|---|---|---|")
        for n in ncu:
            print(f"| {n.precision} | {n.m}×{n.n}×{n.k} | {n.path} | {n.duration_seconds * 1e6:.1f} | "
                  f"{mhz(n.ncu_sm_clock_hertz)} | {mhz(n.nvml_sm_clock_hertz)} ({n.nvml_reads}) | {mhz(n.nvml_min_hertz)} | "
                  f"{r3(n.ncu_over_nvml)} |")
    verdict = clock_check.clock_verdict(loops, ncu, clock_check.idle_probe_over_nvml(lines, reads))
    print(f"\nverdict: {verdict.finding}" + (f" (decided by the {verdict.decided_by})" if verdict.decided_by else "")
          + f": {verdict.describe()}")
    if verdict.finding == "cycles" and sku.tensor_clock_ratio:
        print("catalog: " + ", ".join(f"tensor_clock_ratio.{pipe} = {r:g}" for pipe, r in sku.tensor_clock_ratio.items())
              + f" ({sku.key}; f_ref = peak clock / ratio)")


@app.command("catalog")
def catalog_command(
    key: str | None = typer.Argument(None, help="One SKU key (omit for all)."),
    as_json: bool = typer.Option(False, "--json"),
    catalog: Path | None = CatalogOption,
) -> None:
    """The GPU catalog: SKUs, reference clocks, dense peaks, prices."""
    from rich.table import Table

    from kernelfleet.catalog import Catalog

    cat = Catalog.load(catalog)
    skus = [cat.get(key)] if key else list(cat)
    if as_json:
        print(json.dumps([s.to_dict() for s in skus], indent=2))
        return
    t = Table("key", "name", "SMs", "peak MHz", "OFU f_ref MHz", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GB/s", "$/h")
    for s in skus:
        bf16, fp8 = s.peak_flops("bf16"), s.peak_flops("fp8")
        price = min((p.usd_per_hour for p in s.prices), default=None)
        f_ref, _ = s.ofu_reference_clock()
        t.add_row(
            s.key, s.name, str(s.sm_count), f"{s.reference_clock_hertz / 1e6:.0f}", f"{f_ref / 1e6:.0f}",
            "—" if bf16 is None else f"{bf16 / 1e12:.1f}", "—" if fp8 is None else f"{fp8 / 1e12:.1f}",
            f"{s.memory_bandwidth_bytes_per_second / 1e9:.0f}", "—" if price is None else f"{price:.2f}",
        )
    Console().print(t)


for _name, _function in cli_place.COMMANDS:
    app.command(_name)(getattr(cli_place, _function))
bench_app.command("disagg")(cli_place.disagg_command)
bench_app.command("disagg-nccl")(cli_place.disagg_nccl_command)
bench_app.command("serve")(cli_place.serve_command)


def main() -> None:
    """Entry point: a user's mistake or a broken environment is one line, not a traceback."""
    logging.basicConfig(level=logging.WARNING, format="kernelfleet: %(message)s")
    try:
        app()
    except KernelfleetError as exc:
        err.print(f"kernelfleet: error: {exc}", markup=False, highlight=False, emoji=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
