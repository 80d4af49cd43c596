"""The plans ``kernelfleet serve hf:DIR --plans DIR`` serves: one folder per batch bucket, checked
before anything is built.

Layout: ``DIR/batch-B/`` for every bucket ``B`` the server captures (``graphs.buckets``), each what
``kernelfleet plan PROGRAM COSTS --policy all --keep-home --out DIR/batch-B`` writes for the bucket's step
(``hf:MODEL,serve-decode,batch=B,slots=S,context=C``); the server takes its
``latency-greedy.json`` and ``throughput-milp.json`` (the two plans the online monitor switches
between, as ``kernelfleet bench serve`` does).

Checked in two stages, each failure one line naming the file: :func:`read` before the model loads
(every bucket's folder and both plans there, each a plan document); :func:`kv_placement` once the
server has captured each bucket's step on its devices, before any plan graph is built: each plan
passes the validator against its bucket's capture (launch count, devices, pins, memory: a plan made
for another model or bucket fails here) and keeps the KV cache where the server can switch plans.

The KV cache is state the server cannot move between steps: a request's keys and values are written
by one step and read by every later one, whichever plan runs it. So every launch that touches a
layer's cache (``cache_L_keys``, ``cache_L_values``) must run on one device, and on the same device
in every bucket's and both policies' plans; every plan must also have the same home (where prefill
runs and the logits come back). Under ``resident_state`` (what the server builds with) a cache that
stays on one device is never copied. ``kernelfleet plan --state-home`` (``plan.model.state_home``)
pins every launch that touches the cache, so its plans keep the whole cache on the home device by
construction: the planners and the validator keep pinned launches home.

:func:`weights_read` says which weights a device other than home reads under any of the plans: the
server allocates only those there (``parts.build_reading``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.model import PLANNED_PROGRAM, Plan, Problem
from kernelfleet.plan.model import weights_read as plan_weights
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.monitor import LATENCY, THROUGHPUT

# the monitor's two policies and the files `kernelfleet plan --policy all` writes for them
POLICIES = {LATENCY: "latency-greedy", THROUGHPUT: "throughput-milp"}
KV_NAME = re.compile(r"cache_(\d+)_(keys|values)$")  # serve/placed_step.py's names of each layer's cache


def bucket_folder(root: Path, bucket: int) -> Path:
    return root / f"batch-{bucket}"


def _folder(root: Path) -> Path:
    if not root.is_dir():
        raise UsageError(f"--plans {root}: no such folder (one batch-B folder a bucket, as `kernelfleet plan --out` "
                         "writes it)")
    return root


def planned_slots(root: Path) -> int:
    """The slots a plan folder was made for: its largest ``batch-B`` (``kernelfleet serve --plans``'s
    default ``--slots``; :func:`read` then asks for every bucket below it); UsageError where it has none."""
    sizes = [int(found.name.removeprefix("batch-")) for found in _folder(root).iterdir()
             if found.is_dir() and re.fullmatch(r"batch-[1-9]\d{0,3}", found.name)]
    if not sizes:
        raise UsageError(f"--plans {root}: no batch-B folder (one a batch bucket, as `kernelfleet plan --out "
                         f"{root}/batch-B` writes it)")
    return max(sizes)


def read(root: Path, buckets: list[int]) -> dict[int, dict[str, tuple[Path, Plan]]]:
    """Both plans of every bucket (module docstring), parsed; UsageError naming what is missing."""
    found: dict[int, dict[str, tuple[Path, Plan]]] = {}
    _folder(root)
    for bucket in buckets:
        folder = bucket_folder(root, bucket)
        if not folder.is_dir():
            raise UsageError(f"--plans {root}: no plans for batch bucket {bucket} ({folder}/; the server captures "
                             f"buckets {', '.join(map(str, buckets))}): plan hf:MODEL,serve-decode,batch={bucket} "
                             f"with `kernelfleet plan ... --out {folder}`")
        found[bucket] = {}
        for policy, file in POLICIES.items():
            path = folder / f"{file}.json"
            if not path.is_file():
                raise UsageError(f"{folder}: no {file}.json (write both plans with `kernelfleet plan PROGRAM COSTS "
                                 f"--policy all --out {folder}`)")
            found[bucket][policy] = path, runtime_plans.read(path)
    return found


@dataclass(frozen=True)
class Placement:
    """Where the checked plans keep things: their one home, and the device of each layer's cache."""

    home: str
    kv: dict[str, str]  # cache buffer name -> device

    def away(self) -> dict[str, list[tuple[int, str]]]:
        """Per device other than home, the (layer, ``keys`` or ``values``) caches kept there: prefill
        copies a request's rows of those there."""
        found: dict[str, list[tuple[int, str]]] = {}
        for name, device in sorted(self.kv.items()):
            if device != self.home:
                layer, kind = KV_NAME.match(name).groups()
                found.setdefault(device, []).append((int(layer), kind))
        return found


def slower_under_load(found: dict[int, dict[str, tuple[Path, Plan]]]) -> list[tuple[int, float, float]]:
    """(bucket, its throughput plan's step, its latency plan's step), in seconds, for every bucket
    whose throughput plan's one-request latency (``details.latency_seconds``) is predicted over 1 %
    above its latency plan's. The server runs one batch a step, so a step costs its plan's latency
    and such a throughput plan only slows the steps the monitor gives it under load (docs/serve.md,
    "What the throughput plan is worth here")."""
    out = []
    for size, plans in sorted(found.items()):
        wide, fast = (plans[policy][1].details.latency_seconds for policy in (THROUGHPUT, LATENCY))
        if wide is not None and fast is not None and wide > 1.01 * fast:
            out.append((size, wide, fast))
    return out


def kv_devices(program: Program, assignment: list[str], where: str) -> dict[str, str]:
    """The device of each layer's cache under ``assignment``; UsageError where launches on two
    devices touch one cache."""
    names = {b.id: b.name for b in program.buffers if b.name and KV_NAME.match(b.name)}
    if not names:
        raise UsageError(f"{where}: the step has no KV cache named cache_L_keys/values: it is not the server's "
                         "decode step (profile hf:MODEL,serve-decode)")
    seen: dict[str, tuple[str, int]] = {}
    for launch in program.launches:
        for buffer in {a.buffer for a in launch.accesses if a.buffer in names}:
            device = assignment[launch.index]
            first = seen.setdefault(names[buffer], (device, launch.index))
            if first[0] != device:
                raise UsageError(f"{where}: {names[buffer]} is touched on {first[0]} (launch {first[1]}) and on "
                                 f"{device} (launch {launch.index}): a plan must keep each layer's KV cache on one "
                                 "device (plan it with kernelfleet plan --state-home)")
    return {name: device for name, (device, _) in sorted(seen.items())}


def plans_home(found: dict[int, dict[str, tuple[Path, Plan]]], default: str) -> str:
    """The home the first plan of ``found`` names (``default`` where it names none); :func:`kv_placement`
    checks that every plan keeps it."""
    first = next(plan for policies in found.values() for _, plan in policies.values())
    return first.details.home or default


def kv_placement(found: dict[int, dict[str, tuple[Path, Plan]]], problems: dict[int, Problem]) -> Placement:
    """The one placement of home and KV cache every plan of ``found`` keeps, once each passed the
    validator against its bucket's Problem (the server's capture); UsageError otherwise."""
    first: tuple[str, Placement] | None = None
    for bucket, policies in sorted(found.items()):
        for path, plan in policies.values():
            runtime_plans.checked(problems[bucket], plan, str(path))
            home = plan.details.home or problems[bucket].home
            mine = Placement(home, kv_devices(problems[bucket].program, plan.assignment, str(path)))
            if first is None:
                first = str(path), mine
            elif mine.home != first[1].home:
                raise UsageError(f"{path}: home {mine.home}, {first[0]}: home {first[1].home}: every plan needs the "
                                 "same home (prefill runs there and the logits come back there): plan them with --keep-home")
            elif mine.kv != first[1].kv:
                name = next(n for n in mine.kv if mine.kv[n] != first[1].kv.get(n))
                raise UsageError(f"{path} keeps {name} on {mine.kv[name]}, {first[0]} on {first[1].kv.get(name)}: "
                                 "every bucket's and policy's plan must keep each layer's KV cache on the same "
                                 "device (the server switches plans between steps)")
    if first is None:
        raise UsageError("no plans to serve")
    return first[1]


def planned_programs(root: Path, found: dict[int, dict[str, tuple[Path, Plan]]]) -> dict[int, Program]:
    """Each bucket's program, as ``kernelfleet plan --policy all --out`` writes it beside its plans
    (``program.json``: the step the plans place); UsageError naming the file."""
    programs = {}
    for bucket in found:
        path = bucket_folder(root, bucket) / PLANNED_PROGRAM
        if not path.is_file():
            raise UsageError(f"{path.parent}: no {PLANNED_PROGRAM}, the program its plans place (`kernelfleet plan "
                             f"PROGRAM COSTS --policy all --out {path.parent}` writes it beside them)")
        programs[bucket] = Program.load(path)
    return programs


def weights_read(found: dict[int, dict[str, tuple[Path, Plan]]], programs: dict[int, Program], device: str,
                 prefix: str) -> set[str]:
    """The names of the weights the launches ``device`` runs under any plan of ``found`` read: every
    named weight buffer of its bucket's program (``programs``) such a launch reads
    (``plan.model.weights_read``), by its name less ``prefix``."""
    return {name.removeprefix(prefix) for bucket, policies in found.items() for _, plan in policies.values()
            for name in plan_weights(programs[bucket], plan.assignment, device) if name.startswith(prefix)}
