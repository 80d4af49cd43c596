"""The place half's commands: ``ptx``, ``analyze``, ``calibrate``, ``profile``, ``plan``,
``plan-serve``, ``census``, ``run``, ``bench disagg`` and ``bench serve``.

Plain functions; ``cli.py`` registers them on the one ``kernelfleet`` command (see ``COMMANDS``).
They parse and print only: the work is in ``ptx/``, ``kernels/``, ``profile/``, ``plan/`` and
``runtime/``; the benchmarks' timing and tables in ``bench/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from kernelfleet.cli_common import CatalogOption, err, out_console
from kernelfleet.documents import read_text
from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.plan.links import COPY_US, LINK_GBPS

CopyUsOption = typer.Option(COPY_US, "--copy-us", help="Microseconds each copy between devices costs beyond its "
                            "bytes (default: measured on an H200's partitions, docs/place.md).")


def ptx(
    path: Path = typer.Argument(..., help="A PTX file (nvcc -ptx, or Triton's asm['ptx'])."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Which pointer parameters each kernel of a PTX file reads and writes, and what pins it."""
    from rich.table import Table

    from kernelfleet.ptx import analyze, parse

    text = read_text(path)
    try:
        results = analyze(parse(text))
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    if as_json:
        print(json.dumps([{"entry": r.entry, "params": r.params, "pinned": r.pinned, "reasons": r.reasons,
                           "evidence": r.evidence} for r in results], indent=1))
        return
    out = Console()
    for r in results:
        t = Table("parameter", "access", title=f"{r.entry}" + (" [red](pinned)[/]" if r.pinned else ""),
                  title_justify="left")
        for name, kind in r.params.items():
            t.add_row(name, kind)
        out.print(t)
        for reason in r.reasons:
            out.print(f"  pinned: {reason}")


def _need_gpu(what: str, instead: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise EnvironmentProblem(f"{what} runs on an NVIDIA GPU and none is visible here; {instead}")


def analyze(
    target: str | None = typer.Argument(
        None, help="TARGET: a reference step, MODULE:FACTORY returning a step (e.g. "
        "kernelfleet.workloads.steps:llama_decode) or hf:DIR (a transformers model directory)."
    ),
    out: Path = typer.Option(Path("kernelfleet-analyze"), "--out", help="Folder for capture, program and graph."),
    capture_file: Path | None = typer.Option(None, "--capture", help="Analyse a recorded raw capture (no GPU)."),
    check: bool = typer.Option(True, "--check/--no-check", help="Replay node by node: memory-diff, PTX probe."),
    ops: bool = typer.Option(True, "--ops/--no-ops", help="Record ATen ops (off for torch.compile'd steps)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Capture a model step's kernels: what each reads and writes, how that is known, what is pinned."""
    from rich.table import Table

    from kernelfleet import analyze as analysis

    if capture_file is not None:
        numbers = analysis.analyze_capture(capture_file, out)
    elif target is not None:
        _maker(target)  # a target that cannot be made is one line before the GPU is looked for
        _need_gpu("capturing a step", "pass --capture FILE to analyse a recorded capture")
        numbers = analysis.analyze_step(target, out, check=check, record_ops=ops)
    else:
        raise UsageError("give MODULE:FACTORY, a reference step or hf:DIR to capture, or --capture FILE "
                         "to analyse a recorded capture")
    if as_json:
        print(json.dumps(numbers, indent=1))
        return
    t = Table("", "", title=f"kernelfleet analyze — {numbers.get('step', target)}", title_justify="left")
    for key, value in numbers.items():
        if key not in ("step", "pinned_reasons", "kept_whole"):
            t.add_row(key.replace("_", " "), str(value))
    Console().print(t)
    for reason, count in numbers["pinned_reasons"].items():
        Console().print(f"  pinned x{count}: {reason}", markup=False, highlight=False)
    for op, count in numbers["kept_whole"].items():
        Console().print(f"  kept whole on one device x{count}: {op} (its kernels pass data through its own workspace)",
                        markup=False, highlight=False)
    err.print(f"wrote {out}/program.json, {out}/graph.dot")


def calibrate_command(
    profile: list[str] | None = typer.Option(
        None, "--profile", help="NAME:SMS[+HOG] (green-context SMs, plus a hog's), repeatable; default: a sweep."
    ),
    against: str = typer.Option("l40s,a100-sxm-80gb", "--against", help="COMPUTE_SKU,BANDWIDTH_SKU to imitate."),
    out: Path | None = typer.Option(None, "--out", help="Write the measured rates (JSON)."),
) -> None:
    """GEMM, GEMV and copy rates of device profiles, and the pair closest to a real pair of GPUs."""
    from rich.table import Table

    from kernelfleet.profile import run

    pair = tuple(against.split(","))
    if len(pair) != 2:
        raise UsageError(f"--against wants COMPUTE_SKU,BANDWIDTH_SKU, got {against!r}")
    run.targets(*pair)  # an unknown SKU fails before any GPU work
    _need_gpu("calibration", "there is nothing to measure")
    specs = [run.parse_profile(p) for p in profile] if profile else run.sweep_specs()
    rows = run.calibrate_profiles(specs)
    t = Table("profile", "SMs", "hog SMs", "GEMM TFLOP/s", "GEMV GB/s", "copy GB/s", title="kernelfleet calibrate")
    for r in rows:
        t.add_row(r["name"], str(r["granted_sms"] or "all"), str(r["hog_sms"] or "-"),
                  f"{r['gemm_flops_per_second'] / 1e12:.0f}", f"{r['gemv_bytes_per_second'] / 1e9:.0f}",
                  f"{r['copy_bytes_per_second'] / 1e9:.0f}")
    Console().print(t)
    try:
        c = run.choose(rows, pair)
        Console().print(f"closest to {pair[0]} + {pair[1]}: compute {c.compute['name']} / bandwidth "
                        f"{c.bandwidth['name']}: GEMM ratio {c.gemm_ratio:.2f} (target {c.target_gemm_ratio:.2f}), "
                        f"bandwidth ratio {c.bandwidth_ratio:.2f} (target {c.target_bandwidth_ratio:.2f})")
    except UsageError as exc:
        err.print(f"no pair: {exc}")
    if out is not None:
        run.Calibration(rows).save(out)
        err.print(f"wrote {out}")


def profile_command(
    target: str = typer.Argument(..., help="TARGET: a reference step, MODULE:FACTORY or hf:DIR."),
    out: Path = typer.Option(Path("kernelfleet-profile"), "--out", help="Folder for capture, program and costs."),
    profile: list[str] | None = typer.Option(
        None, "--profile", help="NAME:SMS[+HOG]\\[/KERNELS], repeatable; default: calibrate and take the pair closest "
        "to L40S + A100. The whole GPU is always timed too. Devices on other GPUs (@GPU) or with other KERNELS "
        "(math-attention, efficient-attention) capture the step for themselves and the cost table is over units "
        "of matched ops (merge runs of other machines with kernelfleet profile-merge)."
    ),
    trials: int = typer.Option(5, "--trials", help="Timed trials per launch (the median is kept)."),
    flush_l2_mb: int = typer.Option(0, "--flush-l2-mb", help="Write this many MB before each trial (cold L2; "
                                    "256 clears an H200's). 0: back-to-back copies, warm L2."),
    ops: bool = typer.Option(True, "--ops/--no-ops", help="Record ATen ops (off for torch.compile'd steps)."),
    measure_link: bool = typer.Option(False, "--measure-link", help="Also time a copy between every two profiles as "
                                      "the executor's graph makes it, into the cost table: plan then prices copies "
                                      "with it instead of --copy-us/--link-gbps (on an H200's partitions it predicted "
                                      "copies cheaper and chose worse: docs/place.md)."),
    graph_copies: int = typer.Option(2, "--graph-copies", help="Copies of the step in each profile's whole-step "
                                     "graph (its own captures: the memory of the step that many times a profile). "
                                     "1 halves that and leaves out the free-slot speedup, which plans for one "
                                     "request in flight (--in-flight 1) never use."),
) -> None:
    """Time every kernel of a captured step on each device profile: a cost table for `kernelfleet plan`."""
    from rich.progress import Progress

    from kernelfleet import analyze as analysis
    from kernelfleet.profile import run
    from kernelfleet.profile.devices import ProfileSpec

    if trials < 1 or flush_l2_mb < 0 or graph_copies not in (1, 2):
        raise UsageError(f"--trials must be >= 1, --flush-l2-mb >= 0 and --graph-copies 1 or 2, got {trials}, "
                         f"{flush_l2_mb} and {graph_copies}")
    _maker(target)
    _need_gpu("profiling", "plan from a recorded cost table instead (kernelfleet plan)")
    specs = [run.parse_profile(p) for p in profile] if profile else list(run.pair_specs(
        run.choose(run.calibrate_profiles(run.sweep_specs()))))
    if len({(spec.device, spec.kernels) for spec in specs}) > 1:  # each device captures with its own kernels
        if not ops:
            raise UsageError("devices with other kernels are matched by ATen op: drop --no-ops")
        with Progress(transient=True) as bar:
            task = bar.add_task("capturing and timing on each device", total=None)
            done = analysis.profile_per_device(target, specs, lambda n: bar.advance(task, n), trials,
                                               flush_l2_mb << 20, out, measure_link, graph_copies)
        Console().print(done)
        return
    said = _phases()
    captured, program = analysis.capture_step(target, record_ops=ops)
    said(f"captured the step: {len(program.launches)} launches")
    whole = ProfileSpec("whole")
    with Progress(transient=True) as bar:
        task = bar.add_task("timing kernels", total=len(program.launches) * (len(specs) + 1))
        seconds = run.time_on(captured, specs + [whole], lambda n: bar.advance(task, n), trials, flush_l2_mb << 20)
    said(f"timed each launch on {len(specs) + 1} profiles, {trials} trials")
    # the whole step as a graph on each device: alone, free, and with the other devices busy (the whole GPU
    # overlaps the partitions, so it runs on the first device's captures and is never timed together)
    chains = analysis.step_chains(target, specs, {(specs[0].device, specs[0].kernels): captured}, graph_copies)
    said(f"captured {sum(map(len, chains.values())) - 1} replicas of the step for the whole-step graphs")
    graphs = run.step_times({**chains, whole.name: chains[specs[0].name]}, specs + [whole],
                            together=[spec.name for spec in specs], measure_link=measure_link)
    said("timed the whole-step graphs")
    done = analysis.write_profile(captured, program, seconds, out, graphs)
    Console().print(done)


def _phases():
    """``said(what)``: one line on stderr for each phase of a long command, with its seconds (a
    progress bar shows nothing where the output is not a terminal, e.g. a batch job's log)."""
    import time

    last = [time.perf_counter()]

    def said(what: str) -> None:
        now = time.perf_counter()
        err.print(f"  {what} ({now - last[0]:.1f} s)", markup=False, highlight=False)
        last[0] = now

    return said


def profile_merge_command(
    folders: list[Path] = typer.Argument(..., help="Folders kernelfleet profile wrote for devices that capture "
                                         "for themselves (from one machine or several), the home device's first."),
    out: Path = typer.Option(..., "--out", help="Folder for the merged unit program and cost table."),
) -> None:
    """Merge per-device profiles (each device timed on its own kernels, on this machine or another) into one
    program of units and one cost table for `kernelfleet plan`."""
    from kernelfleet import analyze as analysis

    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"{folder}: no such folder (kernelfleet profile --out writes one)")
    Console().print(analysis.merge_profiles(folders, out))


def plan_command(
    program: Path = typer.Argument(..., help="The kernel program (JSON)."),
    costs: Path = typer.Argument(..., help="The cost table (JSON): seconds of each launch on each device."),
    device: list[str] | None = typer.Option(
        None, "--device", help="NAME[:MEMORY_GB], repeatable (default: every device the cost table measured)."
    ),
    link: list[str] | None = typer.Option(
        None, "--link", help="DEVICE:DEVICE:GBPS in gigabytes/s, repeatable."
    ),
    link_gbps: float = typer.Option(LINK_GBPS, "--link-gbps", help="GB/s of every device pair --link leaves out."),
    copy_us: float = CopyUsOption,
    policy: str = typer.Option(
        "throughput", "--policy", help="throughput|latency|single|replicas|pipeline|attention-ffn|all"
    ),
    predict: list[str] | None = typer.Option(
        None, "--predict", help="A catalog SKU key to add through the roofline cost model, repeatable."
    ),
    profile: list[str] | None = typer.Option(
        None, "--profile", help="NAME=SKU or NAME=CALIBRATION.json: what a measured device is, for --predict."
    ),
    out: Path | None = typer.Option(None, "--out", help="Plan JSON to write (a folder for --policy all)."),
    gantt: Path | None = typer.Option(
        None, "--gantt", help="PNG Gantt chart of one request under the plan (for all: the throughput plan)."
    ),
    time_limit: float = typer.Option(30.0, "--time-limit", help="Seconds for the throughput MILP."),
    in_flight: int | None = typer.Option(
        None, "--in-flight", help="Plan for this many requests in flight: the throughput policy picks the plan "
        "(switch budgets, the best single cut, every baseline) fastest per request as the executor runs it "
        "(plan/slots.py, each slot mode), and every plan's time at K is printed."),
    keep_home: bool = typer.Option(False, "--keep-home", help="Every plan keeps the first --device as its home (no "
                                   "single-device plan elsewhere, no replicas): for a step whose state lives there, "
                                   "as kernelfleet serve --plans needs."),
    state_home: bool = typer.Option(False, "--state-home", help="Pin every launch that touches the step's state "
                                    "(a KV cache, a recurrent state: named buffers the step writes) to the first "
                                    "--device, and --keep-home: the plans kernelfleet serve --plans takes."),
    catalog: Path | None = CatalogOption,
    edge_fit: Path | None = typer.Option(None, "--edge-fit", help="A per-edge fit (python -m bench.place_table "
                                         "--edges --fit-out): every prediction in a slot mode charges it."),
    weights_like: Path | None = typer.Option(None, "--weights-like", help="A plan (with the program.json "
                                             "kernelfleet plan --out wrote beside it): every launch that reads "
                                             "weights it placed runs where it keeps them, so each device holds the "
                                             "same weights under every plan made so (kernelfleet serve --plans)."),
) -> None:
    """Place a kernel program on devices: the chosen policy's plan beside every baseline."""
    from rich.table import Table

    from kernelfleet.plan import command

    done = command.setup(program, costs, device or [], link or [], link_gbps, predict or [], profile or [],
                         catalog, copy_us, keep_home, edge_fit, state_home, weights_like)
    chosen, plans = command.make_plans(done.problem, policy, time_limit, in_flight=in_flight)
    console = out_console()
    for note in done.notes:
        console.print(note, markup=False, highlight=False)
    header, rows = command.table(done.problem, plans, chosen)
    fastest, ties, per_request = None, [], {}
    if in_flight is not None:
        from kernelfleet.plan.slots import SUFFIXES, per_request_modes

        header.append(f"time/request, {in_flight} in flight (fastest slot mode)")
        # every plan in every slot mode, named as bench disagg names its rows ("pipeline, slots free")
        predicted = {plan.policy: per_request_modes(done.problem, plan, in_flight) for plan in plans}
        for row, plan in zip(rows, plans):
            modes = predicted[plan.policy]
            mode = min(modes, key=modes.get) if modes else None
            row.append("—" if mode is None else f"{command.seconds(modes[mode])} ({mode})")
        per_request = {name + SUFFIXES[mode]: v for name, modes in predicted.items() for mode, v in modes.items()}
        fastest, ties = command.near_ties(per_request)
    t = Table(*header, title=f"kernelfleet plan — {policy} (* chosen)", title_justify="left")
    for row in rows:
        t.add_row(*row)
    console.print(t)
    if (line := command.verdict(plans)) is not None:
        console.print(line, markup=False, highlight=False)
    if fastest is not None:
        console.print(f"with {in_flight} request{'s' if in_flight > 1 else ''} in flight the fastest is {fastest} "
                      f"({command.seconds(per_request[fastest])} per request, predicted for the executor)",
                      markup=False, highlight=False)
        if ties:  # one graph under several plans' names is one entry
            same: dict[float, list[str]] = {}
            for name in ties:
                same.setdefault(per_request[name], []).append(name)
            named = ", ".join(f"{' = '.join(sorted(names))} ({command.seconds(v)})" for v, names in same.items())
            console.print(f"within {command.NEAR_TIE:.0%} of it, a tie to the model (its graph times move that much "
                          f"between runs): {named}; time them on the devices before settling (kernelfleet bench "
                          "disagg TARGET --plans DIR)", markup=False, highlight=False)
    if out is not None:
        for path in command.write(plans, chosen, out, done.problem.program):
            err.print(f"wrote {path}")
    if gantt is not None:
        from kernelfleet.plan.gantt import draw

        err.print(f"wrote {draw(done.problem, chosen or plans[0], gantt)}")


def plan_serve_command(
    target: str = typer.Argument(..., help="hf:DIR, the model kernelfleet serve will serve (a transformers causal "
                                 "LM directory)."),
    profile: list[str] = typer.Option(..., "--profile", help="NAME:SMS[+HOG]\\[/KERNELS]\\[@GPU], each device, twice "
                                      "or more, as kernelfleet profile takes them."),
    device: list[str] | None = typer.Option(None, "--device", help="NAME[:MEMORY_GB] for kernelfleet plan, "
                                            "repeatable (default: the profiles' names)."),
    slots: int = typer.Option(8, "--slots", help="The server's KV-cache slots: plans for every bucket 1, 2, 4, ... up "
                              "to it."),
    context: int = typer.Option(2048, "--context", help="Tokens per slot, as kernelfleet serve --context."),
    out: Path = typer.Option(Path("kernelfleet-plans"), "--out", help="The plans folder for kernelfleet serve --plans "
                             "(a batch-B folder a bucket)."),
    work: Path | None = typer.Option(None, "--work", help="Where the profiles and the commands' log are kept "
                                     "(default OUT/profiles)."),
    trials: int = typer.Option(3, "--trials", help="kernelfleet profile's --trials."),
    time_limit: float = typer.Option(60.0, "--time-limit", help="kernelfleet plan's --time-limit a bucket (seconds)."),
    in_flight: int = typer.Option(1, "--in-flight", help="kernelfleet plan's --in-flight (default 1: the server runs "
                                  "one batch a step)."),
    one_share: bool = typer.Option(False, "--one-share", help="Every plan keeps the largest bucket's weight "
                                   "placement (--weights-like), so each device holds one share whichever plan runs: "
                                   "for a model larger than either device (give --device NAME:MEMORY_GB)."),
) -> None:
    """Make the plans kernelfleet serve --plans runs: per batch bucket, kernelfleet profile then plan."""
    from rich.progress import Progress

    from kernelfleet.plan.command import MAX_IN_FLIGHT
    from kernelfleet.profile.run import parse_profile
    from kernelfleet.serve.graphs import buckets
    from kernelfleet.serve.plan_buckets import Buckets, make, on_gpu, on_this_gpu, reserving

    model = Path(target.removeprefix("hf:"))
    if not target.startswith("hf:") or "," in target or not (model / "config.json").is_file():
        raise UsageError(f"TARGET must be hf:DIR, a model directory with a config.json (no options: the buckets' "
                         f"steps are made from it), got {target!r}")
    names = [parse_profile(spec).name for spec in profile]  # one line for a malformed one
    planned = [spec.split(":")[0] for spec in device] if device else names
    if len(set(names)) < 2 or len(set(names)) != len(names) or sorted(planned) != sorted(names):
        raise UsageError(f"--profile must name two or more devices once each, and --device the same ones; got "
                         f"profiles {', '.join(names)} and devices {', '.join(planned)}")
    if not 1 <= in_flight <= MAX_IN_FLIGHT:
        raise UsageError(f"--in-flight must be within 1 to {MAX_IN_FLIGHT}, got {in_flight}")
    spec = reserving(Buckets(model.resolve(), slots, context, list(profile), list(device or names), out,
                             work or out / "profiles", trials, time_limit, in_flight, one_share))
    spec.check()
    _need_gpu("making serve plans", "make them on the GPU that will serve (kernelfleet profile captures the step "
              "there)")
    spec = on_this_gpu(spec, lambda line: err.print(line, markup=False, highlight=False))
    err.print(f"plans for {target}, {slots} slots of {context} tokens, into {out} (profiles and log in {spec.work}):",
              markup=False, highlight=False)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("profiling and planning, bucket by bucket", total=len(buckets(slots)) + one_share)
        make(spec, lambda line: bar.console.print(line, markup=False, highlight=False), lambda: bar.advance(task))
    served = [x for p in profile for x in ("--profile", on_gpu(p))]
    caps = " (add --device NAME:MEMORY_GB caps of their own: the server's hold the KV cache and its workspace too)"
    print("serve them: kernelfleet serve " + " ".join([target, "--plans", str(out), *served, "--context", str(context)])
          + (caps if any(":" in d for d in device or []) else ""))


def census_command(
    costs: Path = typer.Argument(..., help="Per-launch seconds on two device profiles: a cost table (costs.json) or "
                                 "a bench/capture_run.py <step>.profile.json."),
    between: str | None = typer.Option(None, "--between", help="A,B: the two profiles compared (default: the "
                                       "table's two besides 'whole')."),
    counters: Path | None = typer.Option(None, "--counters", help="ncu CSV of bench/profile_counters.sh (.gz or "
                                         "not): split the census by each kernel's class (tensor, compute, memory, "
                                         "latency)."),
    groups: Path | None = typer.Option(None, "--groups", help="Its groups file (default: <step>.groups.json beside "
                                       "<step>.ncu.csv[.gz])."),
    program: Path | None = typer.Option(None, "--program", help="The kernel program (JSON): check the groups name "
                                        "its kernels."),
    class_on: str | None = typer.Option(None, "--class-on", help="The profile whose counters class the kernels "
                                        "(default: whole if ncu returned it, else the first it returned)."),
) -> None:
    """Which device each kernel prefers: the share of kernels and of time faster on the slower profile, by class."""
    from rich.table import Table

    from kernelfleet.profile.table import load_seconds, preference, preference_by_class

    table = load_seconds(costs)
    names = list(dict.fromkeys(k for row in table.seconds for k in row))
    pair = between.split(",") if between else [n for n in names if n != "whole"]
    if len(pair) != 2 or not set(pair) <= set(names):
        raise UsageError(f"--between: need two of the table's profiles {names}, got {between or pair}")
    console = out_console()
    if counters is None:
        p = preference(table, *pair)
        console.print(_census_line(p), markup=False, highlight=False)
        return
    kinds, note = _classes(counters, groups, program, class_on, len(table.seconds))
    overall, by_class = preference_by_class(table, *pair, kinds)
    console.print(_census_line(overall), markup=False, highlight=False)
    console.print(note, markup=False, highlight=False)
    t = Table("class", "launches", f"share of {overall.stronger}'s time", f"faster on {overall.weaker}",
              "share of the class's time", title=f"kernelfleet census — {costs.name}", title_justify="left")
    for c in by_class:
        share = c.share_faster_of_time
        t.add_row(c.kind, str(c.kernels), f"{c.share_of_time(overall):.0%}",
                  f"{c.kernels_faster_on_weaker} ({c.share_faster_of_kernels:.0%})", "—" if share is None else f"{share:.0%}")
    console.print(t)


def _census_line(p) -> str:
    return (f"{p.weaker} is slower overall ({p.weaker_total_seconds * 1e3:.2f} ms vs {p.stronger_total_seconds * 1e3:.2f} "
            f"ms), yet {p.kernels_faster_on_weaker} of {p.kernels} kernels ({p.share_of_kernels:.0%}; "
            f"{p.share_of_time:.0%} of {p.stronger}'s time) run faster on it")


def _classes(counters: Path, groups: Path | None, program: Path | None, class_on: str | None,
             launches: int) -> tuple[list[str], str]:
    """The class of every launch from a counters run, and a line saying what ncu returned per profile."""
    from kernelfleet.kernels.ir import Program
    from kernelfleet.profile.counters import launch_classes, parse_counters, seen
    from kernelfleet.profile.groups import Groups

    text = read_text(counters, "an ncu CSV")
    if groups is None:
        stem = next((counters.name.removesuffix(s) for s in (".ncu.csv", ".ncu.csv.gz") if counters.name.endswith(s)),
                    None)
        if stem is None:
            raise UsageError(f"--counters {counters}: give --groups too (the default is <step>.groups.json beside "
                             "<step>.ncu.csv[.gz])")
        groups = counters.with_name(stem + ".groups.json")
    mapping = Groups.load(groups)
    if mapping.launches != launches:
        raise UsageError(f"{groups}: groups of a program of {mapping.launches} launches, the cost table has "
                         f"{launches}: not the same step")
    if program is not None:
        try:
            mapping.check_program(Program.load(program))
        except UsageError as exc:
            raise UsageError(f"{groups}: {exc}") from exc
    rows = parse_counters(text, mapping, str(counters))
    got = seen(rows, mapping)
    returned = [name for name, (n, _) in got.items() if n]
    if not returned:
        raise UsageError(f"{counters}: ncu returned no counters for any profile ({got})")
    chosen = class_on or ("whole" if "whole" in returned else returned[0])
    if chosen not in returned:
        raise UsageError(f"--class-on {chosen}: ncu returned counters for {', '.join(returned)} only")
    counts = ", ".join(f"{name} {n} of {launched}" for name, (n, launched) in got.items())
    return launch_classes(rows, mapping, chosen), f"counters (groups returned / launched): {counts}; classes from {chosen}"


# (command name, function), in the order `kernelfleet --help` lists them
COMMANDS = [("ptx", "ptx"), ("analyze", "analyze"), ("calibrate", "calibrate_command"),
            ("profile", "profile_command"), ("profile-merge", "profile_merge_command"), ("plan", "plan_command"),
            ("plan-serve", "plan_serve_command"), ("census", "census_command"), ("run", "run_command")]


def _maker(step: str):
    """``make(device, seed)`` of the target, checked now (workloads/targets.py)."""
    from kernelfleet.workloads.targets import step_maker

    return step_maker(step)


def _check_plans(plans: Path) -> None:
    if not plans.is_dir():
        raise UsageError(f"{plans}: no such folder (write one with `kernelfleet plan PROGRAM COSTS --policy all --out {plans}`)")


def _profiles(device: list[str]) -> dict:
    """The device profiles of ``--device``, by name; UsageError when two share a name."""
    from kernelfleet.profile.run import parse_profile

    profiles = {spec.name: spec for spec in map(parse_profile, device)}
    if len(profiles) != len(device):
        raise UsageError(f"--device: give profiles with different names, got {', '.join(device)}")
    return profiles


def _pair(device: list[str]) -> dict:
    """The two device profiles of ``--device``, by name."""
    profiles = _profiles(device)
    if len(profiles) != 2:
        raise UsageError(f"--device: give two profiles with different names, got {', '.join(device)}")
    return profiles


def _gpus_present(profiles: dict) -> None:
    import torch

    missing = [s.device for s in profiles.values() if s.device >= torch.cuda.device_count()]
    if missing:
        raise EnvironmentProblem(f"--device names GPU {missing[0]}; this machine has {torch.cuda.device_count()}")


PairOption = typer.Option(["compute:56+64@0", "bandwidth:32@1"], "--device",
                          help="NAME:SMS[+HOG]@GPU\\[/KERNELS], twice: the pair, named as the plans name their devices (KERNELS: "
                          "default, math-attention, efficient-attention: what the step is captured with there).")


StepArgument = typer.Argument(..., help="TARGET: a reference step (e.g. llama8b-decode), MODULE:FACTORY or hf:DIR.")
PlansOption = typer.Option(..., "--plans", help="A folder of plans for this step (kernelfleet plan --policy all --out).")
RepeatsOption = typer.Option(10, "--repeats", help="Runs timed per strategy (median).")


def _pair_bench(step: str, plans: Path, costs: Path | None, device: list[str], what: str):
    """Checked inputs of a benchmark on the pair: the step's maker, the two profiles, the cost table."""
    make = _maker(step)
    _check_plans(plans)
    table = _cost_table(costs)
    profiles = _pair(device)
    _need_gpu(what, "its recorded results are in docs/place.md")
    _gpus_present(profiles)
    return make, profiles, table


def run_command(
    step: str = StepArgument,
    plan: Path = typer.Option(..., "--plan", help="A plan for this step (kernelfleet plan --out PLAN.json), "
                              "naming its devices as --device does."),
    device: list[str] = typer.Option(["compute:56+64@0", "bandwidth:32@1"], "--device",
                                     help="NAME:SMS[+HOG]@GPU\\[/KERNELS], repeatable: the devices the plan names, the first "
                                     "its home unless the plan names one."),
    repeats: int = typer.Option(10, "--repeats", help="Launches of the plan's graph timed (median)."),
    costs: Path | None = typer.Option(None, "--costs", help="The cost table the plan was made from: the plan is "
                                      "checked against what it says each device can run."),
    slots: int | None = typer.Option(None, "--slots", help="Requests in flight, each a slot with replicas of its "
                                     "own, in one graph (default: the requests the plan was made for, else 1)."),
    slot_mode: str | None = typer.Option(None, "--slot-mode", help="sequential|free|scheduled: how the slots share "
                                         "the devices (default: the plan's slot_mode, the one its policy chose)."),
) -> None:
    """Run one plan of a step: capture it on every device, validate the plan, gate it on bit-identical
    outputs, and time it."""
    from kernelfleet.runtime import plans
    from kernelfleet.runtime.command import run_shape

    make = _maker(step)
    placed = plans.read(plan)
    if not placed.assignment:
        raise UsageError(f"{plan}: a {placed.policy} plan shares requests between devices and places no launch; "
                         "run each device's single plan instead")
    if repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {repeats}")
    table = _cost_table(costs)
    run_shape(placed, slots, slot_mode, table)  # a bad count or mode fails before any GPU work
    profiles = _profiles(device)
    _need_gpu("running a plan", "run it on a GPU machine (`kernelfleet plan` makes and validates plans on the CPU)")
    from kernelfleet.errors import KernelfleetError
    from kernelfleet.runtime.command import run_plan

    _gpus_present(profiles)
    ran = run_plan(make, profiles, placed, str(plan), repeats, table, slots, slot_mode)
    console = out_console()
    console.print(f"{ran.policy} plan of {step}, home {ran.home}"
                  + (f", {ran.slots} slots {ran.slot_mode}" if ran.slots > 1 else "") + f": gate {ran.gate}",
                  markup=False, highlight=False)
    if ran.seconds is None:
        raise KernelfleetError(f"{plan}: the plan failed the gate and was not timed")
    each = (f" of {ran.slots} requests, {ran.seconds / ran.slots * 1e3:.3f} ms per request" if ran.slots > 1 else "")
    console.print(f"{ran.seconds * 1e3:.3f} ms per step{each} (median of {repeats}), {ran.copies} copies "
                  f"({ran.copy_bytes / 1e6:.1f} MB)", markup=False, highlight=False)


def disagg_command(
    step: str = StepArgument,
    plans: Path = PlansOption,
    device: list[str] = PairOption,
    slots: int = typer.Option(4, "--slots", help="Micro-batches per graph, each with replicas of its own."),
    repeats: int = RepeatsOption,
    out: Path = typer.Option(Path("kernelfleet-disagg"), "--out", help="Folder for disagg.json."),
    costs: Path | None = typer.Option(None, "--costs", help="The cost table the plans were made from: adds "
                                      "list-scheduled slots and each graph's predicted time."),
    copy_us: float = CopyUsOption,
    link_gbps: float = typer.Option(LINK_GBPS, "--link-gbps", help="GB/s of the link the plans were made for: "
                                    "each graph's predicted time costs its copies so (kernelfleet plan's flags)."),
) -> None:
    """Every placement strategy for one step on the emulated pair, gated on identical outputs, in one run."""
    from kernelfleet.plan.links import check_link

    check_link(link_gbps, copy_us)
    make_step, profiles, table = _pair_bench(step, plans, costs, device, "the disaggregation benchmark")
    from kernelfleet.bench.disagg import disagg
    from kernelfleet.plan.slots import uniform_link

    disagg(make_step, profiles, plans, slots, repeats, out, out_console(), table, uniform_link(copy_us, link_gbps))


def disagg_nccl_command(
    step: str = StepArgument,
    plans: Path = PlansOption,
    device: list[str] = PairOption,
    slots: int = typer.Option(3, "--slots", help="Micro-batches per run, each with replicas of its own."),
    repeats: int = RepeatsOption,
    out: Path = typer.Option(Path("kernelfleet-disagg"), "--out", help="Folder for disagg-nccl.json (rank 0 writes it)."),
    costs: Path | None = typer.Option(None, "--costs", help="The cost table the plans were made from: adds "
                                      "list-scheduled slots."),
    place_weights: str | None = typer.Option(None, "--place-weights", help="Only this plan (a policy of --plans, "
                                             "e.g. pipeline): run it, then free on each GPU the weights its launches "
                                             "there never read, and run it again."),
) -> None:
    """bench disagg with one process per device and NCCL between them; start it with
    `torchrun --nproc-per-node 2 -m kernelfleet bench disagg-nccl STEP --plans PLANS`."""
    make_step, profiles, table = _pair_bench(step, plans, costs, device, "the multi-process disaggregation benchmark")
    from kernelfleet.bench.disagg_nccl import disagg_nccl

    disagg_nccl(make_step, profiles, plans, slots, repeats, out, out_console(), table, place_weights)


def _cost_table(costs: Path | None):
    if costs is None:
        return None
    from kernelfleet.plan.command import load_costs

    return load_costs(costs)  # as the plans were made: scaled to the measured graph times


def serve_command(
    step: str = typer.Argument(..., help="A reference step whose launches are idempotent, e.g. llama8b-prefill "
                               "(one request = one step)."),
    plans: Path = typer.Option(..., "--plans", help="A folder of plans for this step (kernelfleet plan --policy all "
                               "--out): its latency-greedy and throughput-milp plans are served."),
    device: list[str] = PairOption,
    slots: int = typer.Option(3, "--slots", help="Requests per launch of the throughput and request-distribution "
                              "graphs (K)."),
    slo_ms: float = typer.Option(500.0, "--slo-ms", help="Latency target: SLO capacity is the highest rate whose p99 "
                                 "is within it."),
    rates: str = typer.Option("2,4,6,8,10", "--rates", help="Offered requests/s, comma-separated (Poisson)."),
    seconds: float = typer.Option(8.0, "--seconds", help="Seconds of arrivals per rate and mode (then the queue drains)."),
    window_ms: float = typer.Option(300.0, "--window-ms", help="The monitor's window W."),
    beta: float = typer.Option(1.5, "--beta", help="The monitor's threshold on latency / execution time."),
    repeats: int = typer.Option(10, "--repeats", help="Graph launches timed per graph (median)."),
    throughput_slots: str = typer.Option("free", "--throughput-slots", help="How the throughput graph's slots share "
                                         "each device: free or sequential (chained)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the arrivals (the same at every rate)."),
    out: Path = typer.Option(Path("kernelfleet-serve"), "--out", help="Folder for serve.json."),
) -> None:
    """Online Poisson requests served by the latency plan, the throughput plan, request distribution and
    the monitor switching between the first two: latency percentiles and SLO capacity, every output checked."""
    from kernelfleet.bench.serve import PLANS, SLOT_MODES, parse_rates

    make = _maker(step)
    _check_plans(plans)
    missing = [f"{p}.json" for p in PLANS.values() if not (plans / f"{p}.json").is_file()]
    if missing:
        raise UsageError(f"{plans}: no {', '.join(missing)} (write them with `kernelfleet plan PROGRAM COSTS "
                         f"--policy all --out {plans}`)")
    offered = parse_rates(rates)
    if slots < 2:
        raise UsageError(f"--slots must be at least 2 (request distribution needs one per device), got {slots}")
    if throughput_slots not in SLOT_MODES:
        raise UsageError(f"--throughput-slots: expected {' or '.join(SLOT_MODES)}, got {throughput_slots!r}")
    for name, value in (("--slo-ms", slo_ms), ("--seconds", seconds), ("--window-ms", window_ms), ("--beta", beta),
                        ("--repeats", repeats)):
        if not value > 0:
            raise UsageError(f"{name} must be > 0, got {value:g}")
    profiles = _pair(device)
    _need_gpu("the serving benchmark", "the serving loop's tests run on the CPU (tests/unit/test_serve.py)")
    from kernelfleet.bench.serve import bench_serve
    from kernelfleet.errors import KernelfleetError

    _gpus_present(profiles)
    results = bench_serve(make, profiles, plans, slots, offered,
                          seconds, slo_ms, window_ms / 1e3, beta, repeats, out, out_console(), seed, throughput_slots)
    if results["corrupted"]:
        raise KernelfleetError(f"{results['corrupted']} served requests had outputs that differ from their "
                               f"references: see {out / 'serve.json'}")
