"""``kernelfleet analyze``: capture a model step and say what is known about its kernels.

:func:`census` is pure (a program and its edges in, a summary out); ``workloads.targets`` makes
the step of a target; :func:`analyze_step` runs the capture on the GPU and writes the raw capture,
the program (JSON) and the dependency graph (DOT).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from kernelfleet.graph.deps import Edge, dependencies, kernel_kind, to_dot, together
from kernelfleet.kernels.ir import Program
from kernelfleet.workloads.targets import load_step


def census(program: Program, edges: list[Edge]) -> dict[str, Any]:
    """Launch kinds, how accesses are known, pinned kernels and why, the op calls kept whole on one
    device (they pass data through their own workspace: ``graph.deps.together``), edges and their bytes."""
    kernels = [launch for launch in program.launches if launch.kind == "kernel"]
    whole = together(program)
    with_ptx = [k for k in kernels if any(a.source in ("ptx-static", "ptx-dynamic") for a in k.accesses)]
    pinned = Counter(launch.pinned for launch in program.launches if launch.pinned)
    return {
        "launches": len(program.launches),
        "kernels": len(kernels),
        "copies": sum(launch.kind != "kernel" for launch in program.launches),
        "distinct_kernels": len({k.name for k in kernels}),
        "kernels_with_ptx": len(with_ptx),
        "kinds": dict(Counter(kernel_kind(launch) for launch in program.launches)),
        "access_sources": dict(Counter(a.source for launch in program.launches for a in launch.accesses)),
        "launches_by_source": dict(Counter(_main_source(launch) for launch in program.launches)),
        "pinned": sum(pinned.values()),
        "pinned_reasons": dict(pinned),
        "op_calls_kept_whole": len(whole),
        "kept_whole": dict(Counter(program.launches[group[0]].op for group in whole)),
        "buffers": len(program.buffers),
        "buffer_roles": dict(Counter(b.role for b in program.buffers)),
        "edges": len(edges),
        "edge_bytes": sum(e.bytes for e in edges),
    }


def _main_source(launch: Any) -> str:
    sources = {a.source for a in launch.accesses}
    for source in ("ptx-dynamic", "ptx-static", "schema", "graph-node", "memory-diff", "conservative"):
        if source in sources:
            return source
    return "none"


def capture_step(target: str, *, record_ops: bool = True) -> tuple[Any, Program]:
    """Capture the step of ``target`` on the GPU: the live capture and its assembled program."""
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.cuda.capture import capture

    fn, args, module, name = load_step(target)  # a reference step, MODULE:FACTORY or hf:DIR
    captured = capture(fn, args, module=module, what=name, record_ops=record_ops)
    return captured, assemble(captured.raw)


def step_chains(target: str, specs: list[Any], captures: dict[tuple[int, str], Any],
                copies: int = 2) -> dict[str, list[Any]]:
    """The captures each profile's whole-step graphs run (``profile/steptime.py``): ``copies`` per
    profile, all different, so that no two chains, and no two devices timed together, share their
    weights and activations (as no two slots of ``bench disagg`` do). The first profile of each
    (GPU, kernels) gets that capture of ``captures`` first; the rest are replicas captured here."""
    import torch

    from kernelfleet.kernels.cuda.capture import capture
    from kernelfleet.profile.devices import choosing_kernels

    given, out = dict(captures), {}
    for spec in specs:
        mine = [given.pop((spec.device, spec.kernels))] if (spec.device, spec.kernels) in given else []
        while len(mine) < copies:
            torch.cuda.set_device(spec.device)
            fn, args, module, name = load_step(target)
            with choosing_kernels(spec.kernels):
                mine.append(capture(fn, args, module=module, what=f"{name} (replica)", record_ops=False))
        out[spec.name] = mine
    return out


def write_analysis(raw: Any, program: Program, out: Path) -> dict[str, Any]:
    """Write the raw capture, the program (JSON) and its graph (DOT) under ``out``; the census."""
    edges = dependencies(program)
    out.mkdir(parents=True, exist_ok=True)
    raw.save(out / "capture.json.gz")
    (out / "program.json").write_text(program.to_json())
    (out / "graph.dot").write_text(to_dot(program, edges))
    return {"step": raw.about.get("what", ""), **census(program, edges)}


def analyze_capture(path: Path, out: Path) -> dict[str, Any]:
    """The census of a recorded raw capture (no GPU), its program and graph written under ``out``."""
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.raw import RawCapture

    raw = RawCapture.load(path)
    return write_analysis(raw, assemble(raw), out)


def analyze_step(target: str, out: Path, *, check: bool = True, record_ops: bool = True) -> dict[str, Any]:
    """Capture ``target`` on the GPU, check its claims by replay, and write the analysis."""
    from kernelfleet.kernels.checks import probe_disagreements, unsound_writes, with_observations
    from kernelfleet.kernels.cuda.replay import observe, stepwise_matches_graph

    captured, program = capture_step(target, record_ops=record_ops)
    findings: dict[str, Any] = {}
    if check:
        seen = observe(captured, program)
        findings = {"node_by_node_equals_graph": stepwise_matches_graph(captured, program),
                    "unsound_writes": len(unsound_writes(program, seen.writes)),
                    "probe_disagreements": len(probe_disagreements(program, seen.probed)),
                    "probed_kernels": len(seen.probed)}
        program = with_observations(program, seen.writes, seen.probed)
    return {**write_analysis(captured.raw, program, out), **findings}


def profile_per_device(target: str, specs: list[Any], progress: Any, trials: int, flush_l2_bytes: int,
                       out: Path, measure_link: bool = False, copies: int = 2) -> str:
    """Devices that may launch other kernels — other kernel choices (``ProfileSpec.kernels``) or
    other GPUs: capture the step once per (GPU, kernels), on that GPU, time each device on its own
    capture's launches, and write under ``out`` each device's capture and launch costs
    (``capture.DEVICE.json.gz``, ``launches.DEVICE.json``) and, lined up into units
    (:func:`merge_profiles`), the home device's unit program and the units' cost table."""
    import torch

    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.cuda.capture import capture
    from kernelfleet.profile.devices import choosing_kernels
    from kernelfleet.profile.run import step_times, time_on
    from kernelfleet.profile.table import cost_table

    captures = {}
    for gpu, kernels in dict.fromkeys((spec.device, spec.kernels) for spec in specs):
        torch.cuda.set_device(gpu)
        fn, args, module, name = load_step(target)  # built on this GPU
        with choosing_kernels(kernels):
            captures[gpu, kernels] = capture(fn, args, module=module, what=f"{name} ({kernels} kernels)")
    out.mkdir(parents=True, exist_ok=True)
    seconds = {spec.name: time_on(captures[spec.device, spec.kernels], [spec], progress, trials,
                                  flush_l2_bytes)[spec.name] for spec in specs}
    graphs = step_times(step_chains(target, specs, captures, copies), specs, measure_link=measure_link)
    for spec in specs:
        captured = captures[spec.device, spec.kernels]
        about, mine = captured.raw.about, graphs.of(spec.name)
        table = cost_table(captured.raw, assemble(captured.raw), {spec.name: seconds[spec.name]},
                           f"measured on {about.get('device')} GPU {spec.device}, profile {spec.name} "
                           f"({spec.kernels} kernels)", mine)
        captured.raw.save(out / f"capture.{spec.name}.json.gz")
        (out / f"launches.{spec.name}.json").write_text(table.to_json())
    return merge_profiles([out], out, graphs.together)


def merge_profiles(folders: list[Path], out: Path, together: float | None = None) -> str:
    """Line up every device's capture found in ``folders`` (``capture.DEVICE.json.gz`` with its
    ``launches.DEVICE.json``, as :func:`profile_per_device` writes them, from one run or several)
    into units, the first folder's first device the home, and write the home's unit program and
    the units' cost table (``program.json``, ``costs.json``) and every device's files under ``out``.
    ``together``: the two devices' graphs launched together once, where the run that wrote them timed
    both (request distribution's own graph, each device on its own kernels); the launch tables keep
    one device each, so only that run can say it."""
    import shutil
    from dataclasses import replace

    from kernelfleet.costs.table import CostTable
    from kernelfleet.documents import read_text
    from kernelfleet.errors import UsageError
    from kernelfleet.graph.units import differing_units, views
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.raw import RawCapture
    from kernelfleet.profile.table import StepTimes, graph_note, unit_table

    raws, programs, seconds, sources, where = {}, {}, {}, [], {}
    graphs = StepTimes({}, {}, {})
    for folder in folders:
        found = sorted(folder.glob("capture.*.json.gz"))
        if not found:
            raise UsageError(f"{folder}: no capture.DEVICE.json.gz there (write one with kernelfleet profile)")
        for path in found:
            device = path.name[len("capture."):-len(".json.gz")]
            if device in raws:
                raise UsageError(f"{path}: device {device!r} is also in {where[device]}: give each device its own name")
            launches = folder / f"launches.{device}.json"
            table = CostTable.from_json(read_text(launches, "a launch cost table"), str(launches))
            raws[device], where[device] = RawCapture.load(path), folder
            programs[device] = assemble(raws[device])  # once: assembling runs the PTX analysis
            column = [row.get(device) for row in table.seconds]
            if len(column) != len(programs[device].launches):
                raise UsageError(f"{launches}: {len(column)} launches, its capture {path.name} has "
                                 f"{len(programs[device].launches)}")
            seconds[device] = column
            sources.append(table.source)
            graphs = graphs.joined(StepTimes.of_table(table, device))
    graphs = replace(graphs, together=together)
    home = next(iter(raws))
    lined = views(raws, programs, home)
    out.mkdir(parents=True, exist_ok=True)
    for device, folder in where.items():
        for name in (f"capture.{device}.json.gz", f"launches.{device}.json"):
            if folder.resolve() != out.resolve():
                shutil.copy(folder / name, out / name)
    program = lined[home].program
    (out / "program.json").write_text(program.to_json())
    costs = unit_table(lined, seconds, "; ".join(sources), graphs)
    (out / "costs.json").write_text(costs.to_json())
    totals = ", ".join(f"{d} {sum(t or 0 for t in seconds[d]) * 1e3:.2f} ms" for d in seconds)
    note = graph_note(costs)
    return (f"wrote {out}: {len(program.launches)} units (ops lined up across the devices' captures; "
            f"{len(differing_units(lined, home))} run other kernels on some device) x {', '.join(seconds)}; "
            f"launches summed: {totals}" + (f"; {note}" if note else ""))


def write_profile(captured: Any, program: Program, seconds: dict[str, list[float]], out: Path,
                  graphs: Any = None) -> str:
    """Write capture, program and cost table (with each profile's whole-step graph times,
    ``profile.table.StepTimes``, where measured) under ``out``; say which device each kernel prefers."""
    from kernelfleet.profile.table import cost_table, graph_note, preference

    write_analysis(captured.raw, program, out)
    about = captured.raw.about
    costs = cost_table(captured.raw, program, seconds, f"measured on {about.get('device')} profiles "
                                                         f"{', '.join(seconds)} ({about.get('what')})",
                       graphs)
    (out / "costs.json").write_text(costs.to_json())
    lines = [f"wrote {out}/costs.json: {len(program.launches)} launches x {', '.join(seconds)}"]
    lines += [note] if (note := graph_note(costs)) else []
    names = [n for n in seconds if n != "whole"]
    if len(names) >= 2:
        p = preference(costs, names[0], names[1])
        lines.append(f"{p.weaker} is slower overall ({p.weaker_total_seconds * 1e3:.2f} ms vs "
                     f"{p.stronger_total_seconds * 1e3:.2f} ms), yet {p.kernels_faster_on_weaker} of {p.kernels} "
                     f"kernels ({p.share_of_kernels:.0%}; {p.share_of_time:.0%} of {p.stronger}'s time) run faster on it")
    return "\n".join(lines)
