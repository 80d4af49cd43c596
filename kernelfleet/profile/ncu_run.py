"""One launch of every distinct kernel of a step on each device profile, for Nsight Compute (runs on a GPU).

    ncu --nvtx --nvtx-include "counters/" --clock-control none --csv --metrics ... \\
        python3 -m kernelfleet.profile.ncu_run --step llama8b-decode --out DIR

``bench/profile_counters.sh`` runs it. The step is captured and its launches grouped
(``profile/groups.py``); each group's first launch is replayed once per profile inside the nested
NVTX ranges ``counters`` / PROFILE / GROUP, so ncu profiles those and nothing else (a warm-up
replay just before runs outside them). Profiles run without a hog: ncu serializes the GPU's work
anyway, and counts DRAM bytes device-wide, so a concurrent copy loop would be counted as the
kernel's. Each profile's rates are calibrated first (outside the ranges), for
``profile/counters.py``'s shares.

Groups run heaviest first (``--order-by``: a capture_run profile's whole-GPU seconds, else the
most launches), each on every profile before the next, and none starts after ``--seconds``: a run
cut short has its heaviest groups on every profile, and ends normally so ncu writes its CSV.
``DIR/<step>.groups.json`` records the groups, the profiles and what was launched on each.
ncu's CSV goes to stdout, so everything this prints goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from kernelfleet.profile.groups import Groups, by_weight, group_launches

DEFAULT_PROFILES = "whole,compute:56,bandwidth:32"  # the emulated pair's work partitions (profile/devices.py)


def log(text: str) -> None:
    print(f"ncu_run: {text}", file=sys.stderr, flush=True)


def whole_seconds(path: Path | None) -> list[float | None] | None:
    """The whole-GPU seconds per launch of a capture_run profile JSON, or None."""
    if path is None or not path.is_file():
        return None
    return json.loads(path.read_text()).get("profiles", {}).get("whole", {}).get("seconds")


def run(step_name: str, out: Path, profiles: str, seconds: float, order_by: Path | None) -> Groups:
    import torch

    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.cuda.capture import capture
    from kernelfleet.kernels.cuda.replay import replay_preludes
    from kernelfleet.kernels.raw import program_nodes
    from kernelfleet.profile.devices import DeviceProfile
    from kernelfleet.profile.run import parse_profile
    from kernelfleet.profile.timing import calibrate
    from kernelfleet.workloads.steps import REFERENCE, reference

    t0 = time.monotonic()
    specs = [parse_profile(p) for p in profiles.split(",")]
    step = reference(step_name)
    captured = capture(step.fn, step.args, module=step.module, what=step.name,
                       record_ops=not REFERENCE[step_name].get("compile", False))
    program = assemble(captured.raw)
    groups = group_launches(program)
    doc = Groups(step_name, len(program.launches), groups)
    path = out / f"{step_name}.groups.json"
    path.write_text(doc.to_json())  # the mapping exists even if the run is cut off
    nodes = program_nodes(captured.raw)
    resets = replay_preludes(program)  # memsets and writers a kernel needs before it, or it skips or repeats work
    order = by_weight([g for g in groups if g.kind == "kernel"], whole_seconds(order_by))
    log(f"{step_name}: {len(program.launches)} launches, {len(groups)} groups ({len(order)} of kernels), "
        f"captured in {time.monotonic() - t0:.1f} s")
    with ExitStack() as stack:
        ready = {}
        for spec in specs:
            try:
                device = stack.enter_context(DeviceProfile(spec))
                with device.active() as stream:
                    rates = calibrate(stream, spec.device)
            except Exception as exc:  # e.g. no partition under ncu: the other profiles still run
                log(f"{spec.name}: cannot set up ({exc!r}); left out")
                continue
            doc.profiles[spec.name] = {"sms": device.sms, "hog_sms": spec.hog_sms,
                                       "device_sms": torch.cuda.get_device_properties(spec.device).multi_processor_count,
                                       **rates}
            runner = captured.replayer(device.context)
            stack.callback(runner.close)
            ready[spec.name] = (device, runner)
            doc.launched[spec.name] = []
        for n, g in enumerate(order):
            if time.monotonic() - t0 > seconds:
                log(f"deadline: {n} of {len(order)} groups profiled")
                break
            prelude = tuple(nodes[m] for m in resets.get(g.representative, ()))
            for name, (device, runner) in list(ready.items()):
                try:
                    with device.active() as stream:
                        runner.one(nodes[g.representative], stream.cuda_stream, prelude)  # outside the ranges: loads, warms
                        stream.synchronize()
                        for label in ("counters", name, g.id):
                            torch.cuda.nvtx.range_push(label)
                        try:
                            runner.one(nodes[g.representative], stream.cuda_stream, prelude)
                            stream.synchronize()
                        finally:
                            for _ in range(3):
                                torch.cuda.nvtx.range_pop()
                except Exception as exc:  # one profile failing (ncu and a partition?) must not lose the others
                    log(f"{name}: {g.id} failed ({exc!r}); {name} is dropped for the rest of the run")
                    del ready[name]
                    continue
                doc.launched[name].append(g.id)
            path.write_text(doc.to_json())
        else:
            log(f"all {len(order)} groups profiled")
    log(f"{step_name}: done after {time.monotonic() - t0:.1f} s; wrote {path}")
    return doc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", required=True, help="a reference step (kernelfleet.workloads.steps.REFERENCE)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profiles", default=DEFAULT_PROFILES, help="NAME[:SMS], comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="start no group after this many seconds")
    parser.add_argument("--order-by", type=Path, help="a capture_run <step>.profile.json: heaviest groups first")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run(args.step, args.out, args.profiles, args.seconds, args.order_by)


if __name__ == "__main__":
    main()
