"""The serve benchmark's ``plans`` cases (``python -m bench.serve_gpu --cases plans``): kernelfleet's
own plans served beside the baselines a user has, on one GPU.

The plans are made as ``kernelfleet plan-serve`` makes them (``serve/plan_buckets.py``: per batch
bucket of the server's slots, 1, 2, 4, ... ``SLOTS``, ``kernelfleet profile`` on partitions a:64 and
b:56, then ``kernelfleet plan --policy all --state-home --in-flight 1``), the profiles in DIR and the
plans in ``DIR/plans`` (``--plans-dir`` keeps them across runs: a bucket whose plans are there, made
for as many in flight, is not made again). ``--plan-in-flight`` of the benchmark sets the number in
flight (0 leaves it out: plan's default, many).

Three servers then take the same load, all with ``SLOTS`` slots (``--plan-slots``):

* ``plans``: ``kernelfleet serve --plans DIR/plans --profile a:64@0 --profile b:56@0``: the latency
  plan and the MILP's throughput plan, the online monitor switching between them;
* ``plans-a``: the same server over plans that run everything on ``a`` (both policies are the
  folder's ``single-a.json``, ``DIR/plans-a``): what the placement adds over its home partition;
* ``plans-whole``: the single-device server on the whole GPU: what a user runs without kernelfleet.

On one H200 the two partitions split one GPU's SMs, so a placement over them cannot beat the whole
GPU (DESIGN, "What emulation on one GPU type can and cannot show"): the comparison shows the
mechanism at full size and what the plans cost against their home partition, not a speed-up.

``capped-plans`` (``--cases capped-plans``) makes them for the memory-capped pair instead: its
devices are the pair's other strategies' (the whole GPU each, ``CAPPED_PROFILES``: the pair differs
in memory, not in SMs), each may hold ``CAP_GB`` (``plan --device a:20``), the weights one share for
every bucket (``plan-serve --one-share``), and the server holds each device to it (``serve --device
a:20``); it is compared with the capped pair's other strategies, so no home-alone twin is made (a
alone cannot hold the model and its cache). Until 2026-12-06 they were made on the partitions above,
64 and 56 SMs, where the other strategies had the whole GPU (docs/validation/serve-gpu.md, tenth run).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from kernelfleet.errors import KernelfleetError
from kernelfleet.plan.model import PLANNED_PROGRAM
from kernelfleet.profile.run import parse_profile
from kernelfleet.serve import plan_buckets
from kernelfleet.serve.graphs import SHORTEST_CONTEXT
from kernelfleet.serve.placed_plans import POLICIES, bucket_folder
from kernelfleet.serve.plan_buckets import IN_FLIGHT, Buckets, Runner, on_gpu

SLOTS = 8
PROFILES = ("a:64", "b:56")  # 120 SMs, what an H200 carves; the device names the plans use
MILP_SECONDS = 60
CAP_GB = 20  # what each device may hold in capped-plans: the memory-capped pair's caps (bench.serve_gpu)
CAPPED_PROFILES = ("a", "b")  # capped-plans' devices: the whole GPU each, as the pair's other strategies run


def pair_profiles(capped: bool = False, second_gpu: int = 0) -> tuple[str, ...]:
    """The plans' two devices: on two GPUs (``second_gpu`` above 0, issue 20) the whole of each, ``a``
    on GPU 0 and ``b`` on ``second_gpu``; on one GPU ``PROFILES``' partitions, or for ``capped``
    ``CAPPED_PROFILES``."""
    if second_gpu:
        return ("a", f"b@{second_gpu}")
    return CAPPED_PROFILES if capped else PROFILES


def prepare(model: Path, out: Path, context: int, trials: int, run: Runner = plan_buckets.kernelfleet,
            milp_seconds: float = MILP_SECONDS, in_flight: int | None = IN_FLIGHT, slots: int = SLOTS,
            room: Callable[[Buckets], Buckets] | None = None, capped: bool = False,
            second_gpu: int = 0) -> tuple[Path, Path | None]:
    """Every bucket's plans for ``slots`` slots in ``out/plans`` (made where missing, or made for
    another number in flight) and their home-alone twins in ``out/plans-a`` (module docstring); the
    two folders. ``room``: the spec as the GPU's memory allows it (``plan_buckets.on_this_gpu``);
    ``capped``: the plans of ``capped-plans`` (on ``CAPPED_PROFILES``, each device held to
    ``CAP_GB``, one share of the weights), without twins (None); ``second_gpu``: on two GPUs
    (:func:`pair_profiles`)."""
    plans, alone = out / "plans", out / "plans-a"
    profiles = pair_profiles(capped, second_gpu)
    devices = [parse_profile(spec).name + (f":{CAP_GB}" if capped else "") for spec in profiles]
    spec = Buckets(model, slots, context, list(profiles), devices, plans, out, trials, milp_seconds, in_flight,
                   one_share=capped)
    try:
        made = plan_buckets.make(room(spec) if room else spec, lambda line: print(line, flush=True), run=run)
    except KernelfleetError as exc:
        raise SystemExit(f"bench.serve_gpu: {exc}") from None
    if capped:
        return plans, None
    for bucket in made:
        folder = bucket_folder(plans, bucket)
        if not (folder / "single-a.json").is_file():
            raise SystemExit(f"bench.serve_gpu: {folder}: no single-a.json beside the plans (kernelfleet plan "
                             "--policy all writes it)")
        home = alone / f"batch-{bucket}"
        home.mkdir(parents=True, exist_ok=True)
        for file in POLICIES.values():
            shutil.copyfile(folder / "single-a.json", home / f"{file}.json")
        shutil.copyfile(folder / PLANNED_PROGRAM, home / PLANNED_PROGRAM)
    return plans, alone


def served_flags(plans: Path, slots: int = SLOTS, capped: bool = False, second_gpu: int = 0) -> list[str]:
    """``kernelfleet serve``'s flags for a plan folder on the profiles of the plans (:func:`pair_profiles`),
    on GPU 0 where they name none (``capped``: each held to ``CAP_GB``), the plans carried to the
    context buckets the other servers decode with (``--shortest-context``: since 2026-12-07; before,
    the plans' steps attended the whole context)."""
    profiles = pair_profiles(capped, second_gpu)
    caps = [x for spec in profiles for x in ("--device", f"{parse_profile(spec).name}:{CAP_GB}")] if capped else []
    return ["--plans", str(plans), *[x for spec in profiles for x in ("--profile", on_gpu(spec))], *caps,
            "--slots", str(slots), "--shortest-context", str(SHORTEST_CONTEXT)]
