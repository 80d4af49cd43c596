"""The serve benchmark's ``plans`` cases (``python -m bench.serve_gpu --cases plans``): kernelfleet's
own plans served beside the baselines a user has, on one GPU.

The plans are made by the commands a user runs (docs/serve.md), per batch bucket of the server's
slots (1, 2, 4, ... ``SLOTS``), into ``DIR/plans`` (``--plans-dir`` keeps them across runs: a bucket
whose two plans are there is not made again)::

    kernelfleet profile hf:MODEL,serve-decode,batch=B,slots=S,context=C --profile a:64 --profile b:56 --out DIR/prof-B
    kernelfleet plan DIR/prof-B/program.json DIR/prof-B/costs.json --device a --device b --policy all \\
        --state-home --in-flight 1 --time-limit 60 --out DIR/plans/batch-B

``--in-flight 1`` (``IN_FLIGHT``, ``--plan-in-flight`` of the benchmark; 0 leaves it out): the server
runs one batch a step, so a throughput plan made for many requests in flight only slows the steps
the monitor gives it (docs/serve.md, "What the throughput plan is worth here"). Kept plans made for
another number in flight are made again (from the kept profile, where there is one).

Three servers then take the same load, all with ``SLOTS`` slots:

* ``plans``: ``kernelfleet serve --plans DIR/plans --profile a:64@0 --profile b:56@0``: the latency
  plan and the MILP's throughput plan, the online monitor switching between them;
* ``plans-a``: the same server over plans that run everything on ``a`` (both policies are the
  folder's ``single-a.json``, ``DIR/plans-a``): what the placement adds over its home partition;
* ``plans-whole``: the single-device server on the whole GPU: what a user runs without kernelfleet.

On one H200 the two partitions split one GPU's SMs, so a placement over them cannot beat the whole
GPU (DESIGN, "What emulation on one GPU type can and cannot show"): the comparison shows the
mechanism at full size and what the plans cost against their home partition, not a speed-up.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kernelfleet.plan.model import PLANNED_PROGRAM
from kernelfleet.runtime.monitor import THROUGHPUT
from kernelfleet.serve.graphs import buckets
from kernelfleet.serve.placed_plans import POLICIES

SLOTS = 8
PROFILES = ("a:64", "b:56")  # 120 SMs, what an H200 carves; the device names the plans use
MILP_SECONDS = 60
IN_FLIGHT = 1  # requests in flight the throughput plan is made for (module docstring)


def plan_commands(model: Path, out: Path, bucket: int, context: int, trials: int,
                  milp_seconds: float = MILP_SECONDS, in_flight: int | None = IN_FLIGHT) -> list[list[str]]:
    """The two commands that make one bucket's plans (module docstring), as argument lists; the
    profile's is left out where ``out/prof-B`` holds one."""
    profile, plans = out / f"prof-{bucket}", out / "plans" / f"batch-{bucket}"
    profiles = [x for spec in PROFILES for x in ("--profile", spec)]
    devices = [x for spec in PROFILES for x in ("--device", spec.split(":")[0])]
    flight = ["--in-flight", str(in_flight)] if in_flight else []
    kept = all((profile / name).is_file() for name in ("program.json", "costs.json"))
    return [*([] if kept else [["profile", f"hf:{model},serve-decode,batch={bucket},slots={SLOTS},context={context}",
                                *profiles, "--trials", str(trials), "--out", str(profile)]]),
            ["plan", str(profile / "program.json"), str(profile / "costs.json"), *devices, "--policy", "all",
             "--state-home", *flight, "--time-limit", f"{milp_seconds:g}", "--out", str(plans)]]


def made(folder: Path, in_flight: int | None = IN_FLIGHT) -> bool:
    """Both plans and their program are in ``folder``, the throughput plan made for ``in_flight`` (a
    plan that does not read as one is made again)."""
    if not all((folder / name).is_file() for name in (*(f"{file}.json" for file in POLICIES.values()),
                                                      PLANNED_PROGRAM)):
        return False
    try:
        details = json.loads((folder / f"{POLICIES[THROUGHPUT]}.json").read_text()).get("details") or {}
        return (details.get("in_flight") or {}).get("requests") == (in_flight or None)
    except (ValueError, AttributeError):
        return False


def kernelfleet(args: list[str], log: Path) -> None:
    """``kernelfleet ARGS`` in its own process, its output appended to ``log``; SystemExit with one
    line (its last) when it fails."""
    began = time.perf_counter()
    with log.open("a") as sink:
        sink.write(f"$ kernelfleet {' '.join(args)}\n")
        sink.flush()
        done = subprocess.run([sys.executable, "-m", "kernelfleet", *args], stdout=sink, stderr=subprocess.STDOUT,
                              check=False)
    if done.returncode:
        said = (log.read_text().strip().splitlines() or ["(nothing)"])[-1]
        raise SystemExit(f"bench.serve_gpu: kernelfleet {args[0]} failed ({said}; {log} has its output)")
    print(f"  kernelfleet {args[0]} {args[1]}: {time.perf_counter() - began:.0f} s", flush=True)


def prepare(model: Path, out: Path, context: int, trials: int,
            run: Callable[[list[str], Path], None] = kernelfleet,
            milp_seconds: float = MILP_SECONDS, in_flight: int | None = IN_FLIGHT) -> tuple[Path, Path]:
    """Every bucket's plans in ``out/plans`` (made where missing, or made for another number in
    flight) and their home-alone twins in ``out/plans-a`` (module docstring); the two folders."""
    plans, alone = out / "plans", out / "plans-a"
    for bucket in buckets(SLOTS):
        folder = plans / f"batch-{bucket}"
        if made(folder, in_flight):
            print(f"  bucket {bucket}: plans kept from {folder}", flush=True)
        else:
            for args in plan_commands(model, out, bucket, context, trials, milp_seconds, in_flight):
                run(args, out / "plans.log")
        if not (folder / "single-a.json").is_file():
            raise SystemExit(f"bench.serve_gpu: {folder}: no single-a.json beside the plans (kernelfleet plan "
                             "--policy all writes it)")
        home = alone / f"batch-{bucket}"
        home.mkdir(parents=True, exist_ok=True)
        for file in POLICIES.values():
            shutil.copyfile(folder / "single-a.json", home / f"{file}.json")
        shutil.copyfile(folder / PLANNED_PROGRAM, home / PLANNED_PROGRAM)
    return plans, alone


def served_flags(plans: Path) -> list[str]:
    """``kernelfleet serve``'s flags for a plan folder on the profiles of the plans, on GPU 0."""
    return ["--plans", str(plans), *[x for spec in PROFILES for x in ("--profile", f"{spec}@0")], "--slots", str(SLOTS)]
