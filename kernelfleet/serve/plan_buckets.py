"""The plans ``kernelfleet serve --plans DIR`` serves, made in one command: ``kernelfleet plan-serve``.

Per batch bucket of the server's slots (``graphs.buckets``: 1, 2, 4, ... S), the two commands
docs/serve.md gives, each in a process of its own (a profile of two devices on one GPU holds the
step up to four times: one bucket at a time keeps the GPU's memory to one)::

    kernelfleet profile hf:DIR,serve-decode,batch=B,slots=S,context=C --profile ... --out WORK/prof-B
    kernelfleet plan WORK/prof-B/program.json WORK/prof-B/costs.json --device ... --policy all \\
        --state-home --in-flight 1 --out DIR/batch-B

``--in-flight 1``: the server runs one batch a step, so the throughput plan is made for one
(docs/serve.md, "What the throughput plan is worth here"). With ``one_share`` (a model larger than
either device), the largest bucket's plans are made first into ``WORK/first`` and every bucket's
plans keep its throughput plan's weight placement (``--weights-like``), so each device holds one
share whichever plan runs. The largest bucket, because its activations take the most memory beside
the same cache: a share that fits it fits every bucket. (Bucket 1's share did not: on an H100,
2026-12-06, it left device a 20.0019 GB to hold at bucket 64 of the 8B under a 20 GB cap.)

A device capped for the server (``--device NAME:GB``) is capped for the planner at that less what
the server holds there beside a plan's tensors, its workspace (``memory.Footprint.workspace_bytes``,
:func:`reserving`): the planner counts the step's weights, cache and activations, the server's
start-up check the weights, cache and workspace, so a plan made to the whole cap is refused at
start (on an H100, 2026-12-06, bucket 1's 64-slot plan put 19.98 of 20 GB on device a, and the
server adds 1.12 GB).

Resumable: a bucket whose profile is in WORK is not profiled again, and one whose plans are in DIR,
made for as many in flight, is not planned again (a profile or plan cut short mid-write is made
again). What
the folders were made for (the model, slots, context, profiles, devices, one share or not) is
written to ``plan-serve.json`` in each; made for anything else they are refused, in one line naming
what differs, before anything runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.plan.model import PLANNED_PROGRAM
from kernelfleet.profile.steptime import COPIES
from kernelfleet.runtime.monitor import THROUGHPUT
from kernelfleet.serve.graphs import buckets
from kernelfleet.serve.memory import Footprint
from kernelfleet.serve.placed_plans import POLICIES, bucket_folder

IN_FLIGHT = 1  # requests in flight the throughput plan is made for (module docstring)
FIRST = "first"  # WORK/first: the largest bucket's plans, the weight placement every plan keeps with one_share
LOG = "plan-serve.log"  # in WORK: every command's output
MANIFEST = "plan-serve.json"  # in DIR and WORK: what they were made for (Buckets.identity)


@dataclass(frozen=True)
class Buckets:
    """What the plans are made for and with: the model directory, the server's slots and tokens per
    slot, the device profiles (``profile --profile``) and plan's devices (``plan --device``: NAME or
    NAME:GB), the folders, and the commands' settings."""

    model: Path
    slots: int
    context: int
    profiles: list[str]
    devices: list[str]
    plans: Path
    work: Path
    trials: int = 3
    time_limit: float = 60.0
    in_flight: int | None = IN_FLIGHT
    one_share: bool = False
    graph_copies: int = COPIES  # profile --graph-copies (graph_copies below)
    beside_bytes: int = 0  # what the server holds on each device beside a plan's tensors (module docstring)

    def target(self, bucket: int) -> str:
        return f"hf:{self.model},serve-decode,batch={bucket},slots={self.slots},context={self.context}"

    def profile(self, bucket: int) -> Path:
        return self.work / f"prof-{bucket}"

    def profiled(self, bucket: int) -> bool:
        """Bucket ``bucket``'s profile is in WORK, whole (a profile killed mid-write is made again)."""
        return all(_reads(self.profile(bucket) / name) for name in ("program.json", "costs.json"))

    def check(self) -> None:
        """UsageError, before anything runs, for settings no command takes or folders made for others."""
        if self.slots < 1 or self.context < 2 or self.trials < 1 or not 0 < self.time_limit < 86400:
            raise UsageError(f"--slots must be at least 1, --context at least 2, --trials at least 1 and --time-limit "
                             f"within (0, 86400) s; got {self.slots}, {self.context}, {self.trials} and "
                             f"{self.time_limit:g}")
        for given, planned in zip(self.devices, self.planned_devices()):
            if float(planned.partition(":")[2] or 1) <= 0:
                raise UsageError(f"--device {given}: the server's workspace for {self.slots} slots "
                                 f"({self.beside_bytes / 1e9:.2f} GB) leaves nothing of it for the plans")
        for folder in (self.plans, self.work):
            _same_as_kept(folder, self.identity())

    def planned_devices(self) -> list[str]:
        """``plan --device`` for each device: a capped one's cap less what the server holds beside the
        plan (module docstring)."""
        if not self.beside_bytes:
            return self.devices
        return [f"{name}:{float(gb) - self.beside_bytes / 1e9:.3f}" if gb else name
                for name, _, gb in (device.partition(":") for device in self.devices)]

    def identity(self) -> dict:
        """What the folders' profiles and plans are for (module docstring): kept ones must match."""
        found = {"model": str(self.model), "slots": self.slots, "context": self.context, "profiles": self.profiles,
                 "devices": self.devices, "one_share": self.one_share,
                 "weights_of_bucket": self.slots if self.one_share else None}
        planned = self.planned_devices()
        return found if planned == self.devices else {**found, "planned_devices": planned}


def commands(spec: Buckets, bucket: int, out: Path, weights_like: Path | None = None) -> list[list[str]]:
    """The commands that make bucket ``bucket``'s plans into ``out`` (module docstring), as argument
    lists; the profile's is left out where ``spec.work`` holds it."""
    profile = spec.profile(bucket)
    flight = ["--in-flight", str(spec.in_flight)] if spec.in_flight else []
    like = ["--weights-like", str(weights_like)] if weights_like else []
    copies = [] if spec.graph_copies == COPIES else ["--graph-copies", str(spec.graph_copies)]
    profiling = ["profile", spec.target(bucket), *_each("--profile", spec.profiles), "--trials", str(spec.trials),
                 *copies, "--out", str(profile)]
    return [*([] if spec.profiled(bucket) else [profiling]),
            ["plan", str(profile / "program.json"), str(profile / "costs.json"),
             *_each("--device", spec.planned_devices()), "--policy", "all", "--state-home", *flight, *like,
             "--time-limit", f"{spec.time_limit:g}", "--out", str(out)]]


def _reads(path: Path) -> bool:
    """``path`` holds JSON."""
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def _each(flag: str, values: list[str]) -> list[str]:
    return [x for value in values for x in (flag, value)]


def made(folder: Path, in_flight: int | None = IN_FLIGHT) -> bool:
    """Both plans and their program are in ``folder``, the throughput plan made for ``in_flight``
    (None: for plan's default); a plan that does not read as one is made again."""
    if not all((folder / name).is_file() for name in (*(f"{file}.json" for file in POLICIES.values()),
                                                      PLANNED_PROGRAM)):
        return False
    try:
        details = json.loads((folder / f"{POLICIES[THROUGHPUT]}.json").read_text()).get("details") or {}
        return (details.get("in_flight") or {}).get("requests") == (in_flight or None)
    except (ValueError, AttributeError):
        return False


def kernelfleet(args: list[str], log: Path) -> None:
    """``kernelfleet ARGS`` in its own process, its output appended to ``log``; EnvironmentProblem
    with its last line when it fails."""
    with log.open("a") as sink:
        sink.write(f"$ kernelfleet {' '.join(args)}\n")
        sink.flush()
        done = subprocess.run([sys.executable, "-m", "kernelfleet", *args], stdout=sink, stderr=subprocess.STDOUT,
                              check=False)
    if done.returncode:
        said = (log.read_text().strip().splitlines() or ["(nothing)"])[-1]
        raise EnvironmentProblem(f"kernelfleet {args[0]} {args[1]} failed: {said} ({log} has its output)")


Runner = Callable[[list[str], Path], None]


def make(spec: Buckets, said: Callable[[str], None] = print, advance: Callable[[], None] = lambda: None,
         run: Runner = kernelfleet) -> list[int]:
    """Every bucket's plans in ``spec.plans`` (module docstring): made where missing or made for
    another number in flight, each command's line said with its seconds, ``advance`` called once a
    bucket (and once for the first plans with ``one_share``); the buckets."""
    spec.check()
    for folder in (spec.plans, spec.work):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).write_text(json.dumps(spec.identity(), indent=1))
    log = spec.work / LOG

    def ran(args: list[str]) -> None:
        began = time.perf_counter()
        run(args, log)
        said(f"  kernelfleet {args[0]} {args[1]}: {time.perf_counter() - began:.0f} s")

    like = None
    if spec.one_share:
        first = spec.work / FIRST
        if not made(first, spec.in_flight):
            for args in commands(spec, spec.slots, first):
                ran(args)
        like = first / f"{POLICIES[THROUGHPUT]}.json"
        advance()
    found = buckets(spec.slots)
    for bucket in found:
        folder = bucket_folder(spec.plans, bucket)
        if made(folder, spec.in_flight):
            said(f"  bucket {bucket}: plans kept from {folder}")
        else:
            for args in commands(spec, bucket, folder, like):
                ran(args)
        advance()
    return found


def made_for(folder: Path) -> dict | None:
    """What plan-serve made ``folder`` for (``Buckets.identity``), or None where it did not make it;
    UsageError, naming the file, where that file is not what plan-serve writes."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):  # unreadable, not UTF-8 (a ValueError too) or not JSON
        found = None
    shapes = {"model": str, "slots": int, "context": int, "profiles": list, "devices": list, "one_share": bool}
    if (not isinstance(found, dict) or any(type(found.get(key)) is not kind for key, kind in shapes.items())
            or not all(isinstance(x, str) for key in ("profiles", "devices") for x in found[key])):
        raise UsageError(f"{path}: not what kernelfleet plan-serve writes; give another --out or remove it")
    return found


def _same_as_kept(folder: Path, wanted: dict) -> None:
    """UsageError where ``folder`` was made by plan-serve for anything but ``wanted``."""
    kept = made_for(folder)
    if kept is None:
        return
    differ = [f"{key} {kept.get(key)!r} (now {value!r})" for key, value in wanted.items() if kept.get(key) != value]
    if differ:
        raise UsageError(f"{folder} holds plans made for other settings: {', '.join(differ)}; give another --out "
                         "(--work) or remove it")


def on_gpu(profile: str) -> str:
    """``profile`` (``NAME:SMS[+HOG][@GPU][/KERNELS]``) as ``kernelfleet serve --profile`` takes it: on
    GPU 0 where it names none."""
    spec, slash, kernels = profile.partition("/")
    return profile if "@" in spec else f"{spec}@0{slash}{kernels}"


def profile_bytes(spec: Buckets, footprint: Footprint, copies: int) -> dict[int, int]:
    """Per GPU, about what one bucket's profile holds there: ``copies`` steps a profile on it (the
    capture and its replicas for the whole-step graphs, ``profile/steptime.py``), each with the
    model's weights and its slots' cache and rows of logits (activations come on top; the server's
    fixed workspace does not)."""
    from kernelfleet.profile.run import parse_profile

    gpus = [parse_profile(text).device for text in spec.profiles]
    step = footprint.weights_bytes + spec.slots * (footprint.kv_bytes_per_slot + footprint.workspace_bytes_per_slot)
    return {gpu: gpus.count(gpu) * copies * step for gpu in sorted(set(gpus))}


def graph_copies(spec: Buckets, footprint: Footprint, free: Callable[[int], int]) -> int:
    """Copies of the step each profile's whole-step graphs take (``profile --graph-copies``):
    ``COPIES`` (2), as ``profile`` does, where every GPU holds them (``free(gpu)``: its free bytes);
    else 1 for plans of one request in flight, which never use what the second copy measures (the
    free-slot speedup). UsageError, before anything runs, where not even that fits."""
    fewest = 1 if spec.in_flight == 1 else 2
    for copies in range(COPIES, fewest - 1, -1):
        needs = profile_bytes(spec, footprint, copies)
        short = [gpu for gpu, need in needs.items() if need > free(gpu)]
        if not short:
            return copies
    gpu = short[0]
    raise UsageError(f"each bucket's profile holds the step {'once' if copies == 1 else 'twice'} a profile (for "
                     f"its whole-step graphs): about {needs[gpu] / 1e9:.1f} GB on GPU {gpu} for {spec.slots} slots "
                     f"of {spec.context} tokens, which has {free(gpu) / 1e9:.1f} GB free; give fewer --slots or a "
                     "shorter --context")


def reserving(spec: Buckets) -> Buckets:
    """``spec`` with what the server holds on each device beside a plan (module docstring), from the
    model's config, where a device is capped; as it is where none is."""
    if not any(":" in device for device in spec.devices):
        return spec
    import torch

    from kernelfleet.serve.model import footprint

    held = footprint(f"hf:{spec.model}", torch.bfloat16, spec.context).workspace_bytes(spec.slots)
    return replace(spec, beside_bytes=held)


def on_this_gpu(spec: Buckets, said: Callable[[str], None]) -> Buckets:
    """``spec`` with the graph copies its GPUs' free memory allows (:func:`graph_copies`, from the
    model's config), said where fewer than profile's default; UsageError where none fits. Where
    every bucket's profile is kept, nothing is profiled: ``spec`` as it is."""
    if all(spec.profiled(bucket) for bucket in buckets(spec.slots)):
        return spec
    import torch

    from kernelfleet.serve.model import footprint

    copies = graph_copies(spec, footprint(f"hf:{spec.model}", torch.bfloat16, spec.context),
                          lambda gpu: torch.cuda.mem_get_info(gpu)[0])
    if copies == COPIES:
        return spec
    said(f"  profiles take the step once each (--graph-copies {copies}): twice does not fit the GPU at "
         f"{spec.slots} slots of {spec.context} tokens")
    return replace(spec, graph_copies=copies)
