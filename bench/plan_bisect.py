"""Find the launch that makes a plan fail the correctness gate (runs on two GPUs).

    python3 bench/plan_bisect.py STEP PLAN.json [--devices 0,1] [--profile compute:56+64@0 --profile bandwidth:32@1]

Captures STEP (a name of kernelfleet.workloads.steps.REFERENCE) on both GPUs, then runs plans that
move only a prefix of the launches the failing plan moves away from home, and bisects for the
shortest failing prefix: its last launch is the culprit. Prints that launch (name, ATen op,
accesses) and whether moving it alone fails too, under both schedules. With ``--profile`` (one per
device, named as the plan names them) each replica runs on its device profile, as in
``kernelfleet bench disagg``; without, on whole GPUs.
"""

from __future__ import annotations

import argparse
import json

import torch

from kernelfleet.runtime.replicas import capture_replicas, restore_all
from kernelfleet.profile.devices import DeviceProfile
from kernelfleet.profile.run import parse_profile
from kernelfleet.runtime.executor import Slot, build, release, run
from kernelfleet.workloads.steps import reference


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step")
    parser.add_argument("plan")
    parser.add_argument("--devices", default="0,1")
    parser.add_argument("--profile", action="append", default=[], help="NAME:SMS[+HOG]@GPU, per device")
    args = parser.parse_args()
    plan = json.loads(open(args.plan).read())
    assignment, home = plan["assignment"], plan["details"]["home"]
    other = next(d for d in assignment if d != home)
    gpu = dict(zip((home, other), map(int, args.devices.split(","))))
    replicas, restores = capture_replicas(lambda where, seed: reference(args.step, device=where, seed=seed), gpu)
    torch.cuda.set_device(int(args.devices.split(",")[0]))
    for spec in map(parse_profile, args.profile):  # entered for the rest of the run (the hog keeps going)
        if gpu.get(spec.name) != spec.device:
            raise SystemExit(f"--profile {spec.name}@{spec.device}: the plan's devices are {home} on GPU "
                             f"{gpu[home]} and {other} on GPU {gpu[other]} (--devices)")
        replicas[spec.name].context = DeviceProfile(spec).__enter__().context
    print(f"profiles: {args.profile or 'whole GPUs'}")
    program = replicas[home].program
    on = torch.cuda.Stream()  # the executor launches on a stream of its own
    stream = on.cuda_stream

    def reset() -> None:
        restore_all(restores)

    reset()
    replicas[home].captured.replay()
    torch.cuda.synchronize()
    expected = [t.clone() for t in replicas[home].captured.output_tensors()]
    reset()
    replicas[home].captured.replay()
    torch.cuda.synchronize()
    print(f"graph replay deterministic: {all(torch.equal(a, b) for a, b in zip(expected, replicas[home].captured.output_tensors()))}")

    def differs(moved: list[int], **options) -> int:
        a = [home] * len(assignment)
        for i in moved:
            a[i] = other
        built = build([Slot(replicas, a, home)], resident_state=True, **options)
        try:
            reset()
            run(built, stream)
            torch.cuda.synchronize()
            return sum(int((x != y).sum()) for x, y in zip(expected, replicas[home].captured.output_tensors()))
        finally:
            release(built)

    moved = [i for i, d in enumerate(assignment) if d != home]
    print(f"{len(moved)} launches moved to {other}; whole plan: {differs(moved)} elements differ")
    lo, hi = 0, len(moved)  # moving moved[:lo] passes (lo = 0 trivially), moved[:hi] fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if differs(moved[:mid]):
            hi = mid
        else:
            lo = mid
    culprit = moved[hi - 1]
    launch = program.launches[culprit]
    print(f"shortest failing prefix: {hi} launches; culprit launch {culprit}: {launch.name} (op {launch.op})")
    for a in launch.accesses:
        print(f"   {a.mode:9} buffer {a.buffer} [{a.offset_bytes}, +{a.length_bytes}) {a.source}")
    for name, options in (("overlapping", {}), ("conservative", {"overlap": False})):
        print(f"prefix, {name}: {differs(moved[:hi], **options)} differ; prefix without the culprit: "
              f"{differs(moved[:hi - 1], **options)}; culprit alone: {differs([culprit], **options)}")


if __name__ == "__main__":
    main()
