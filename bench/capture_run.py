"""Capture reference workloads on a GPU, check every access claim, time kernels on device profiles.

    python -m bench.capture_run --out DIR [--steps llama-decode,...] [--profile-steps ...] [--flush-l2-mb 256]

For each step: capture it (kernelfleet.kernels.cuda.capture), save the raw capture (the CPU tests
replay it), assemble the program, replay the step node by node with memory-diff and the dynamic
range probe (kernelfleet.kernels.cuda.replay), check the node-by-node outputs equal the graph's, and
write the findings. Then sweep candidate green-context profiles, pick the pair closest to L40S +
A100 (kernelfleet.profile.run), and time every launch of the profile steps on it and on the whole GPU.
Each part is guarded: a failure is printed with its traceback and the run goes on.

``--flush-l2-mb N`` (N > 0) times each launch after writing N MB (a cold L2; 256 clears an H200's
60 MB) instead of as back-to-back copies, and also times one copy without the write (the same
launch cost, a warm L2: ``warm_single_seconds``). It writes ``<step>.cold-l2.profile.json`` and
``<step>.cold-l2.profiled-capture.json.gz``, so the warm files of an earlier run stay
(``python3 -m kernelfleet.profile.graphtime`` compares both with measured graph times).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from bench import Parser, command_line
from kernelfleet.analyze import census
from kernelfleet.graph.deps import dependencies
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.checks import probe_disagreements, unsound_writes, with_observations
from kernelfleet.kernels.cuda.capture import capture
from kernelfleet.kernels.cuda.driver import CUDA as driver
from kernelfleet.kernels.cuda.replay import observe, replay_preludes, stepwise_matches_graph
from kernelfleet.profile.calibration import Calibration
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec
from kernelfleet.profile.run import calibrate_profiles, choose, pair_specs, sweep_specs
from kernelfleet.profile.timing import calibrate, time_launches
from kernelfleet.workloads.steps import REFERENCE, reference


def guarded(label: str, fn, *args, **kwargs):
    t0 = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
        print(f"[ok] {label} ({time.perf_counter() - t0:.1f} s)", flush=True)
        return result
    except Exception:  # a GPU run is one shot: report and go on
        print(f"[FAILED] {label} ({time.perf_counter() - t0:.1f} s)", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        return None


def node_order_is_topological(captured) -> dict:
    index = {int(n): i for i, n in enumerate(captured.nodes)}
    edges = driver.edges(captured.handle)
    backwards = [(index[a], index[b]) for a, b in edges if index[a] >= index[b]]
    return {"nodes": len(captured.nodes), "edges": len(edges), "backward_edges": backwards[:10]}


def run_step(name: str, out: Path, profile: bool, flush_l2_mb: int = 0) -> None:
    step = reference(name)
    captured = capture(step.fn, step.args, module=step.module, what=step.name,
                       record_ops=not REFERENCE[name].get("compile", False))
    report: dict = {"step": step.name}
    cold = ".cold-l2" if profile and flush_l2_mb else ""  # the warm files of an earlier run stay
    if cold:
        report["flush_l2_bytes"] = flush_l2_mb << 20

    def save() -> None:  # after every part: a GPU fault later must not lose what was measured
        kind = "profile" if profile else "report"
        (out / f"{name}{cold}.{kind}.json").write_text(json.dumps(report, indent=1, default=str))

    captured.raw.save(out / f"{name}{cold}.{'profiled-' if profile else ''}capture.json.gz")
    report["order"] = guarded(f"{name}: node order", node_order_is_topological, captured)
    program = assemble(captured.raw)
    report["census"] = census(program, dependencies(program))
    print(json.dumps(report["census"])[:2000], flush=True)
    save()
    if profile:  # a process of its own (see main), so the checks never run after green contexts
        report["profiles"] = {}
        chosen = chosen_pair(out)
        specs = chosen.pop("specs")
        report["pair"] = chosen
        resets = replay_preludes(program)
        for spec_ in specs + (ProfileSpec("whole"),):
            with DeviceProfile(spec_) as device, device.active() as stream:
                calib = guarded(f"{name}: calibrate {spec_.name}", calibrate, stream)
                seconds = guarded(f"{name}: time {spec_.name}{' (cold L2)' if cold else ''}", time_launches,
                                  captured, stream, resets=resets, context=device.context,
                                  flush_l2_bytes=flush_l2_mb << 20)
                single = guarded(f"{name}: time {spec_.name} (one copy, warm L2)", time_launches, captured,
                                 stream, resets=resets, context=device.context, copies=1) if cold else None
            report["profiles"][spec_.name] = {"calibration": calib, "seconds": seconds, "sms": device.sms,
                                              "hog_bytes_per_second": device.hog_bytes_per_second}
            if cold:
                report["profiles"][spec_.name]["warm_single_seconds"] = single
            save()
        return
    same = guarded(f"{name}: node-by-node replay equals graph", stepwise_matches_graph, captured, program)
    report["stepwise"] = {"bit_identical": same}
    save()
    seen = guarded(f"{name}: memory-diff + probe", observe, captured, program)
    if seen is not None:
        unsound = unsound_writes(program, seen.writes)
        disagree = probe_disagreements(program, seen.probed)
        report["observed"] = {"writes": {str(k): v for k, v in seen.writes.items()},
                              "probed": {str(k): v for k, v in seen.probed.items()},
                              "unprobed": {str(k): v for k, v in seen.unprobed.items()},
                              "checked_bytes": seen.checked_bytes}
        report["unsound_writes"] = [(f.launch, f.buffer, f.start, f.end, f.what) for f in unsound]
        report["probe_disagreements"] = [(f.launch, f.buffer, f.start, f.end, f.what) for f in disagree]
        print(f"{name}: {len(seen.writes)} launches wrote, {len(unsound)} unsound write ranges, "
              f"{len(seen.probed)} kernels probed, {len(disagree)} probe disagreements, "
              f"unprobed {len(seen.unprobed)}", flush=True)
        grown = with_observations(program, seen.writes, seen.probed)
        (out / f"{name}.program.json").write_text(grown.to_json())
    save()


def chosen_pair(out: Path) -> dict:
    """The swept pair closest to L40S (compute-rich) + A100 (bandwidth-rich)."""
    choice = choose(Calibration.load(out / "calibration_sweep.json").rows)
    c, b = choice.compute, choice.bandwidth
    print(f"pair: compute {c['sms']}+{c['hog_sms']}, bandwidth {b['sms']}: "
          f"GEMM {choice.gemm_ratio:.2f} (L40S/A100 {choice.target_gemm_ratio:.2f}), "
          f"GEMV bandwidth {choice.bandwidth_ratio:.2f} (A100/L40S {choice.target_bandwidth_ratio:.2f})", flush=True)
    return {"compute": c, "bandwidth": b, "gemm_ratio": choice.gemm_ratio, "bandwidth_ratio": choice.bandwidth_ratio,
            "target": [choice.target_gemm_ratio, choice.target_bandwidth_ratio], "specs": pair_specs(choice)}


def calibration_sweep(out: Path) -> None:
    """GEMM / GEMV / copy rates of candidate profiles, to pick the pair closest to a real one."""
    def show(row: dict) -> None:
        print(f"profile {row['name']:8} GEMM {row['gemm_flops_per_second'] / 1e12:6.0f} TFLOP/s  "
              f"GEMV {row['gemv_bytes_per_second'] / 1e9:6.0f} GB/s  "
              f"copy {row['copy_bytes_per_second'] / 1e9:6.0f} GB/s", flush=True)

    Calibration(calibrate_profiles(sweep_specs(), show)).save(out / "calibration_sweep.json")


def main() -> None:
    parser = Parser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", default="llama-decode,llama-prefill,llama-decode-compiled,moe-decode,"
                                           "mamba-decode,vlm-prefill,dit-denoise,hf-llama-prefill,"
                                           "hf-llama-prefill-compiled")
    parser.add_argument("--profile-steps", default="llama-decode,llama8b-decode,llama8b-prefill")
    parser.add_argument("--only", help="run this one step in this process (the parent runs each step so)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=150.0)
    parser.add_argument("--flush-l2-mb", type=int, default=0, help="profile steps: write this many MB before "
                        "each timed launch (cold L2; 256 clears an H200's) and name the files <step>.cold-l2.*")
    args = parser.parse_args()
    if args.flush_l2_mb < 0:
        parser.error(f"--flush-l2-mb must be >= 0, got {args.flush_l2_mb}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only:
        if args.only == "calibration-sweep":
            calibration_sweep(args.out)
        else:
            run_step(args.only, args.out, args.profile, args.flush_l2_mb)
        return
    print(f"command: {command_line()}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    profiled = args.profile_steps.split(",") if args.profile_steps else []
    checked = [s for s in args.steps.split(",") if s]
    if checked:  # profiled steps are checked too; with --steps "" they are only profiled
        checked += [s for s in profiled if s not in checked]
    runs = [("calibration-sweep", False)] if profiled else []  # the sweep picks the profiled pair
    runs += [(n, False) for n in checked] + [(n, True) for n in profiled]
    for name, profile in runs:  # a process each: a GPU fault ends one step only
        command = [sys.executable, "-m", "bench.capture_run", "--out", str(args.out), "--only", name]
        command += ["--profile", "--flush-l2-mb", str(args.flush_l2_mb)] if profile else []
        t0 = time.perf_counter()
        try:
            code = subprocess.run(command, timeout=args.step_seconds).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        print(f"== {name}: exit {code} after {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
