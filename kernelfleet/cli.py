"""``kernelfleet``: one command, with sub-commands."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from kernelfleet import cli_place, cli_serve
from kernelfleet.cli_common import CatalogOption, err, out_console
from kernelfleet.errors import EnvironmentProblem, KernelfleetError, UsageError
from kernelfleet.telemetry.clock import CLOCK_POLL_SECONDS

if TYPE_CHECKING:
    from kernelfleet.telemetry.sample import Sample
    from kernelfleet.telemetry.scrape import PodRef, ScrapeSource

app = typer.Typer(
    help="See how well every GPU uses its tensor cores (OFU), and place models across GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ReplayOption = typer.Option(None, "--replay", help="Read a recorded trace instead of the GPUs.")
IntervalOption = typer.Option(1.0, "--interval", help="Window length in seconds (>= 0.1).")
ClockPollOption = typer.Option(
    CLOCK_POLL_SECONDS, "--clock-poll", help="Seconds between SM clock reads inside a window (docs/telemetry.md: accuracy vs CPU)."
)
DenseClockOption = typer.Option(
    False, "--dense-clock", help="Read the SM clock every --clock-poll seconds even while every GPU's clock holds still "
    "(default: then once a window)."
)
DemoOption = typer.Option(False, "--demo", help="Use the bundled H200 recording, in a loop.")
SpeedOption = typer.Option(1.0, help="Replay speed (1 = as recorded).")


DEMO_TRACE = Path(__file__).parent / "data" / "demo-h200.jsonl.gz"


def _source(replay: Path | None, demo: bool, interval: float, clock_poll: float, speed: float | None, loop: bool,
            dense_clock: bool = False, rebase: bool = False):
    from kernelfleet.telemetry.nvml import NvmlSource
    from kernelfleet.telemetry.replay import ReplaySource

    if replay is not None and demo:
        raise UsageError("give --replay FILE or --demo, not both")
    if demo:
        return ReplaySource(DEMO_TRACE, speed=speed, loop=loop, rebase_time=True)
    if replay is not None:  # rebase: an agent stores the recording as if it were sampled now
        return ReplaySource(replay, speed=speed, loop=loop, rebase_time=rebase)
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
    """Live OFU for every GPU, refreshed every window: q quits, s sorts, up/down or a digit selects a GPU."""
    from kernelfleet.catalog import Catalog
    from kernelfleet.fleet.agent import attribute_live, attribute_recorded
    from kernelfleet.watch import live
    from kernelfleet.watch.rows import identify_with, rows
    from kernelfleet.watch.screen import snapshot

    cat = Catalog.load(catalog)
    identify = identify_with(attribute_recorded if replay is not None or demo else attribute_live)
    # A pipe or file gets the whole view, not one squeezed to 80 columns.
    out = out_console()
    where = "demo (H200 recording)" if demo else f"replay of {replay.name}" if replay else "live"
    with _source(replay, demo, interval, clock_poll, None if once else speed, loop=demo and not once,
                 dense_clock=dense_clock) as source:
        if once or as_json:
            for batch in source.batches(count=1 if once else None):
                view = rows(batch, cat, identify)
                if as_json:
                    print(json.dumps(view), flush=True)
                else:
                    out.print(snapshot(view, f"kernelfleet watch — {where}", out.width, cat))
            return
        live.run(source, cat, where, out, identify)


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
    expire: float = typer.Option(300.0, "--expire", help="Seconds after its last window that a silent GPU leaves "
                                 "/metrics and the fleet figures (it shows stale after two missed windows)."),
    api_docs: bool = typer.Option(False, "--api-docs", help="Serve the API's OpenAPI schema and pages (/docs)."),
    pod_resources_socket: Path | None = typer.Option(
        None, "--pod-resources-socket", help="The kubelet's pod-resources socket (in Kubernetes, "
        "/var/lib/kubelet/pod-resources/kubelet.sock): name each GPU's namespace, pod and container."),
    pod_owners: str = typer.Option("names", "--pod-owners", help="How a pod's workload (its job) is found: from "
                                   "its name (names), or by asking the API server (api: JobSets exactly; needs "
                                   "deploy/kubernetes/pod-owners)."),
    label_names: str = typer.Option("kernelfleet", "--label-names", help="Label names of /metrics: kernelfleet's "
                                    "(uuid, hostname, model) or dcgm's (UUID, Hostname, modelName), to join dcgm-exporter."),
    process_series: int = typer.Option(0, "--process-series", help="Export the GPU memory of this many of each GPU's "
                                       "largest processes (0..64; default none: one series per process is costly)."),
    store_budget: int = typer.Option(5 * 10**9, "--store-budget", min=1, help="Bytes the store may hold: past them "
                                     "retention drops the oldest raw windows, then minutes, then hours."),
    catalog: Path | None = CatalogOption,
) -> None:
    """Sample every GPU each window, store it, and serve Prometheus metrics and the API."""
    import threading

    from kernelfleet.catalog import Catalog
    from kernelfleet.fleet.agent import Agent, attribute_live, attribute_recorded
    from kernelfleet.fleet.exporter_devices import check_process_series
    from kernelfleet.fleet.exporter_labels import check_style
    from kernelfleet.fleet.listener import Listener, bind, given_token, listen_address
    from kernelfleet.fleet.server import agent_app
    from kernelfleet.fleet.store import Retention, Store
    from kernelfleet.telemetry.scrape import ScrapeSource

    check_style(label_names), check_process_series(process_series)
    token = given_token(token)
    host, port = listen_address(listen, allow_remote, token)
    if not expire > 0:
        raise UsageError(f"--expire must be a positive number of seconds, got {expire}")
    if scrape is not None and (replay is not None or demo):
        raise UsageError("give one source: --scrape URL, --replay FILE or --demo")
    cat = Catalog.load(catalog)
    if scrape is not None:
        # dcgm-exporter refreshes its fields every 30 s by default: scraping faster reads the same values.
        # The source repeats a GPU that left the exporter as stale until it expires: with its own
        # default the agent, seeing a fresh stale window each time, never expired it after --expire.
        source = ScrapeSource(scrape, interval_seconds=interval or 30.0, expire_seconds=expire)
    else:
        source = _source(replay, demo, interval or 1.0, clock_poll, speed, loop=demo, dense_clock=dense_clock,
                         rebase=True)
    recorded = replay is not None or demo
    if pod_owners not in ("names", "api"):
        raise UsageError(f"--pod-owners must be names or api, got {pod_owners!r}")
    pods = _pod_holders(source if scrape is not None else None, pod_resources_socket, pod_owners == "api")
    sock = bind(host, port)  # before the store and the first window: a clash exits now, not after a banner
    try:
        store = Store(store_path, Retention(budget_bytes=store_budget), writer=True)
    except BaseException:
        sock.close()
        raise
    with source:
        the_agent = Agent(source, store, cat, identify=attribute_recorded if recorded else attribute_live,
                          pods=pods,
                          hosts=(lambda: source.hosts) if scrape is not None else None, expire_seconds=expire)
        server = Listener(agent_app(the_agent, store, token, api_docs, label_names, process_series), sock).start()
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


def _pod_holders(scrape: ScrapeSource | None, socket_path: Path | None,
                 ask_api: bool = False) -> Callable[[Sample], Sequence[PodRef]] | None:
    """Who Kubernetes gave each GPU: dcgm-exporter's pod labels when scraping, else the kubelet's
    pod-resources API when its socket is given (a missing socket is one log line, no attribution);
    with ``ask_api``, each pod's workload as the API server says (``telemetry/kubeapi.py``)."""
    if scrape is not None:
        holders = lambda s: scrape.pods.get((s.uuid, s.mig_instance), ())  # noqa: E731
    elif socket_path is None:
        return None
    else:
        from kernelfleet.fleet.pods import sample_holders
        from kernelfleet.telemetry.podresources import PodResources

        kubelet = PodResources.open(socket_path)
        if kubelet is None:
            return None
        holders = lambda s: sample_holders(kubelet.holders(), s)  # noqa: E731
    if not ask_api:
        return holders
    from dataclasses import replace

    from kernelfleet.telemetry.kubeapi import PodOwners

    owners = PodOwners.in_cluster()
    if owners is None:
        return holders
    return lambda s: tuple(replace(r, workload=owners.workload(r.namespace, r.pod)) for r in holders(s))


@app.command()
def dashboard(
    prometheus: str = typer.Option(..., "--prometheus", help="URL of a Prometheus server that scrapes the agents."),
    listen: str = typer.Option("127.0.0.1:9401", help="HOST:PORT for the dashboard and its API."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback listen address."),
    token: str | None = typer.Option(None, envvar="KERNELFLEET_TOKEN", help="Require this bearer token."),
    api_docs: bool = typer.Option(False, "--api-docs", help="Serve the API's OpenAPI schema and pages (/docs)."),
    catalog: Path | None = CatalogOption,
) -> None:
    """The dashboard for a whole fleet, reading a Prometheus server instead of one agent's store."""
    import threading

    from kernelfleet.catalog import Catalog
    from kernelfleet.fleet.listener import Listener, bind, given_token, listen_address
    from kernelfleet.fleet.prometheus_backend import PrometheusBackend
    from kernelfleet.fleet.server import create_app

    token = given_token(token)
    host, port = listen_address(listen, allow_remote, token)
    prices = Catalog.load(catalog)  # the job page's prices, and its H100/H200 note
    backend = PrometheusBackend(prometheus)
    backend.health()  # an unreachable Prometheus is one clear line now, not an error page later
    server = Listener(create_app(backend, token, api_docs=api_docs, catalog=prices), bind(host, port)).start()
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
    below_ofu: float = typer.Option(0.3, "--below-ofu", min=0.0, max=1.0, help="Count the GPU-hours and dollars "
                                    "the job spent in minutes of OFU below this ratio."),
    usd_per_gpu_hour: float | None = typer.Option(None, "--usd-per-gpu-hour", min=0.0, help="Price them at this "
                                                  "instead of the catalog's lowest listed price."),
    catalog: Path | None = CatalogOption,
) -> None:
    """A job's report: OFU per GPU over its lifetime, timeline, bottleneck classes, regressions, and
    what it spent below an OFU."""
    from kernelfleet.catalog import Catalog
    from kernelfleet.fleet import views
    from kernelfleet.fleet.report import job_report, render, spent_below, spent_lines
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
    rows = job_report(report)
    priced = views.prices(Catalog.load(catalog), rows.gpus, usd_per_gpu_hour, "set with --usd-per-gpu-hour")
    spent = spent_below(rows, below_ofu, store.job_seconds_below(name, below_ofu),
                        lambda g: None if priced[g.name] is None else priced[g.name].usd_per_hour)
    if as_json:
        print(json.dumps({**report, "spent": dataclasses.asdict(spent),
                          "prices": {k: v and v.model_dump() for k, v in priced.items()}}, indent=1))
        return
    out = Console()
    for part in render(rows):
        out.print(part)
    for line in spent_lines(spent, priced):
        out.print(line, markup=False, highlight=False)


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
    from kernelfleet.catalog import Catalog
    from kernelfleet.validation import files, markdown, report

    sweep = files.read_sweep(sweep_dir)
    cat = Catalog.load(catalog)
    sku = files.recorded_sku(sweep.samples, cat, "MFU")
    print(markdown.table_ii(report.table_ii(sweep, sku)))
    if ncu is not None:
        print(markdown.ncu_section(report.ncu_section(files.read_ncu_runs(ncu), sweep, sku)))
    if clock is not None:
        run = files.read_clock_run(clock)
        print(markdown.clock_section(report.clock_section(run, files.recorded_sku(run.samples, cat, "FLOP/s"))))


@app.command("catalog")
def catalog_command(
    key: str | None = typer.Argument(None, help="One SKU key (omit for all)."),
    as_json: bool = typer.Option(False, "--json"),
    catalog: Path | None = CatalogOption,
) -> None:
    """The GPU catalog: SKUs, reference clocks, dense peaks, prices."""
    from rich.table import Table

    from kernelfleet.catalog import Catalog
    from kernelfleet.catalog.notes import same_die_note

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
    notes = {same_die_note(cat, s) for s in skus} - {None}
    for note in sorted(notes):  # a mixed H100/H200 fleet reads OFU against two reference clocks
        Console().print(note, markup=False, highlight=False)


for _name, _function in cli_place.COMMANDS:
    app.command(_name)(getattr(cli_place, _function))
bench_app.command("disagg")(cli_place.disagg_command)
bench_app.command("disagg-nccl")(cli_place.disagg_nccl_command)
bench_app.command("serve")(cli_place.serve_command)
app.command("serve")(cli_serve.serve)


def command_named(words: list[str]) -> str:
    """``kernelfleet`` and the subcommands ``words`` start with (``kernelfleet bench disagg``): the
    command a refused flag belongs to where typer's error does not say."""
    command, path = typer.main.get_command(app), ["kernelfleet"]
    for word in words:
        command = getattr(command, "commands", {}).get(word)
        if command is None:
            break
        path.append(word)
    return " ".join(path)


def main() -> None:
    """Entry point: a user's mistake or a broken environment is one line, not a traceback."""
    logging.basicConfig(level=logging.WARNING, format="kernelfleet: %(message)s")
    try:
        code = app(prog_name="kernelfleet", standalone_mode=False)  # a refused flag reaches the handler below
        sys.exit(code if isinstance(code, int) else 0)  # --help and typer.Exit give a code; a command, None
    except typer.TyperException as exc:  # an unknown, missing or malformed flag or argument: one line, not a box
        message = " ".join(exc.format_message().split())
        if message:  # else a command given no arguments, whose help typer has printed
            context = getattr(exc, "ctx", None)
            where = context.command_path if context is not None else command_named(sys.argv[1:])
            err.print(f"kernelfleet: error: {where}: {message} ({where} --help says what it takes)", markup=False,
                      highlight=False, emoji=False)
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:  # end of input at a prompt
        sys.exit(1)
    except KernelfleetError as exc:
        err.print(f"kernelfleet: error: {exc}", markup=False, highlight=False, emoji=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # torch's OutOfMemoryError, named so this module never imports torch
        if type(exc).__name__ != "OutOfMemoryError":
            raise
        first = str(exc).splitlines()[0] if str(exc) else "out of memory"
        err.print(f"kernelfleet: error: the GPU ran out of memory ({first[:160]}); run fewer --slots, a smaller "
                  "step, or on a GPU with more free memory", markup=False, highlight=False, emoji=False)
        sys.exit(1)
