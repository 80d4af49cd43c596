"""What ``kernelfleet serve hf:DIR --plans DIR --profile A --profile B`` builds on the GPU: the placed
backend's devices, captures, plan graphs and gate (``placed.py`` runs them).

In order, each failure one line: the plan folder is read (``placed_plans.read``) before any weight
loads. Where every device (``--profile NAME:SMS[+HOG]@GPU``, a green-context partition as the place
commands take it) captures the home device's kernels, the plans are checked against the program
beside them (``placed_plans.planned_programs``: launch count, pins, memory under each device's
``--device NAME:MEMORY_GB`` cap, one KV placement: ``placed_plans.kv_placement``), and that program
says which weights each device's launches read in some plan (``placed_plans.weights_read``). Each
device, once its share fits its cap or what its GPU has left (``memory.checked_share``), loads only
those (``parts.build_reading``), home first; home keeps every layer's cache (prefill writes them
there), another device the caches the plans keep there. Where home holds only part of the model,
prefill and the gate's reference run on the devices' shares joined into one model (``parts.joined``,
no weight copied; the devices must share one GPU, so across GPUs home holds the whole model). Where
a device captures other kernels than home (a ``--profile`` with ``/KERNELS``), the plans place
units matched only after capture, so every device holds the whole model.

Then every device captures every batch bucket's decode step (``placed_step.decode_step``,
``runtime/replicas.capture_each``) on the whole GPU, and every plan is checked against home's
capture (a plan folder of another model fails here); the state every capture writes (each device's
cache) is saved once, in host memory (the caps are for weights, cache and workspace); the partitions
are carved; then each (bucket, policy) graph is built with ``resident_state`` and gated: run from
the saved state, its logits must equal the home device's own replay of that capture bit for bit,
or, where the devices captured different kernels or home holds only part (the reference then runs
eagerly), agree with it within the place gate's tolerance (``runtime/gate.single_step_verdict``:
logits cosine and near-ties, over this one decode step); otherwise the server does not start. Each
graph keeps its verdict.

With shorter context buckets (``--shortest-context``), every device also captures each batch
bucket's step attending fewer positions, and every plan is carried to those captures
(:func:`shorter_buckets`): built and gated as above, or named at start where it cannot be carried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.graph.units import carried
from kernelfleet.kernels.cuda.replay import saved_state
from kernelfleet.plan.model import Device
from kernelfleet.plan.model import weights_read as plan_weights
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.executor import Slot, build, run
from kernelfleet.runtime.gate import passed, single_step_verdict, zero
from kernelfleet.runtime.monitor import Monitor
from kernelfleet.runtime.replicas import aligned, capture_each, restore_all
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.graphs import Bucket, buckets, described, lengths
from kernelfleet.serve.memory import Footprint, checked_share
from kernelfleet.serve.parts import joined
from kernelfleet.serve.placed import PlacedBackend, PlanGraph
from kernelfleet.serve.placed_plans import (
    kv_devices,
    kv_placement,
    planned_programs,
    plans_home,
    read,
    slower_under_load,
    weights_read,
)
from kernelfleet.serve.placed_step import WEIGHTS_PREFIX, decode_step


def placed_backend(load_model: Callable[[str, set[str] | None], tuple[Any, int]], plans_root: Path,
                   profiles: dict[str, Any], slots: int, context_tokens: int, registry: Any = None,
                   progress: Callable[[int, str], None] | None = None, monitor: Monitor | None = None, *,
                   sizes: tuple[Footprint, Callable[[set[str]], int]],
                   caps: dict[str, int] | None = None, shortest: int | None = None) -> tuple[PlacedBackend, list[Any]]:
    """The placed backend (module docstring) and the entered ``profile.devices.DeviceProfile`` of each
    device (keep them entered while it serves). ``load_model(torch device, names)`` loads the model
    there, holding only the weights ``names`` (None: all), with the bytes of weights it holds;
    ``profiles``: ``profile.devices.ProfileSpec`` by the names the plans use; ``sizes``: the model's
    footprint and the bytes ``load_model`` allocates for ``names``, to check that each device's share
    fits before it loads; ``caps``: the bytes a device may hold (``--device NAME:MEMORY_GB``), by
    name (others: what its GPU has free); ``shortest``: the shortest context bucket the plans are
    carried to (``graphs.lengths``; None: none, every step attends the whole context, as the plans
    were made); ``progress(done, what)`` after each capture."""
    found = read(plans_root, buckets(slots))  # before any weight loads
    from kernelfleet.profile.devices import DeviceProfile

    caps = caps or {}
    home = plans_home(found, next(iter(profiles)))
    if home not in profiles:
        raise UsageError(f"--plans {plans_root}: the plans' home is {home}, which no --profile names "
                         f"({', '.join(profiles)})")
    memory = {name: caps.get(name, torch.cuda.get_device_properties(spec.device).total_memory)
              for name, spec in profiles.items()}
    # where every device captures the home's kernels, the plans' program says before anything loads which weights
    # each device's launches read, and each device holds only those (home too, where every device shares its GPU:
    # prefill and the gate's reference then run on the shares joined); with other kernels the plans place units,
    # matched only once every device has captured, so each device holds them all
    partial = all(spec.kernels == profiles[home].kernels and same_gpu(spec.device, profiles[home].device)
                  for spec in profiles.values())
    names: dict[str, set[str] | None] = dict.fromkeys(profiles)
    placement = None
    if partial:
        programs = planned_programs(plans_root, found)
        placement = checked(found, programs, memory)
        names = {name: weights_read(found, programs, name, WEIGHTS_PREFIX) for name in profiles}
        if any(spec.device != profiles[home].device for spec in profiles.values()):
            names[home] = None  # the shares cannot be joined across GPUs: home holds the whole model
    backends, held = {}, {}
    for name in [home, *(n for n in profiles if n != home)]:
        gpu = profiles[name].device
        # home keeps every cache (prefill writes them all there); another device the caches the plans keep
        # there, where they are known (not yet with units: all)
        kept = None if placement is None or name == home else set(placement.away().get(name, []))
        limit, where = ((caps[name], f"under its cap of {caps[name] / 1e9:.2f} GB (--device {name})") if name in caps
                        else (free_bytes(gpu), f"under the free memory of GPU {gpu}"))
        share(name, sizes, names[name], kept, len(placement.kv) if placement else 0, slots, limit, where)
        model, held[name] = load_model(f"cuda:{gpu}", names[name])
        backends[name] = EagerBackend(model, slots, context_tokens, name, kept)
    whole = backends[home]
    if names[home] is not None and not holds_all(whole.model, names[home]):
        whole = EagerBackend(joined([(backends[n].model, names[n]) for n in backends]), slots, context_tokens, home,
                             cache=backends[home].cache)
    told = progress or (lambda done, what: None)
    captures, programs = {}, []
    for done, size in enumerate(found, 1):
        replicas = captured(backends, profiles, list(backends), size)
        programs += [r.program for r in replicas.values()]
        captures[size, context_tokens] = aligned(replicas)
        if partial and captures[size, context_tokens][home].units is not None:
            raise EnvironmentProblem(f"batch bucket {size}: the devices captured different kernels although their "
                                     "profiles ask for the same ones; give the other device its /KERNELS")
        told(done, described(size, context_tokens))
    # every plan checked against the step this server captured (a plan folder of another model fails here)
    placement = checked(found, {size: captures[size, context_tokens][home].program for size in found}, memory)
    plans = {(size, context_tokens): policies for size, policies in found.items()}
    skipped = shorter_buckets(backends, profiles, (found, captures, plans), placement, names, memory,
                              lengths(context_tokens, shortest)[:-1] if shortest else [], told)
    programs += [r.program for key, replicas in captures.items() if key[1] < context_tokens for r in replicas.values()]
    # every bucket's capture on a device writes the same cache: the state is saved once, not once a capture, and on
    # the host: the caps hold weights, cache and workspace (memory.checked_share), not a second cache (on the GPU
    # the copy ran 32 slots of the 8B out of two 20 GB caps on an H100, 2026-12-06)
    restores = [saved_state(programs, host=True)]
    # the partitions are carved once every capture is made, on the whole GPU, as runtime/gate.py does
    entered = [DeviceProfile(spec).__enter__() for spec in profiles.values()]
    for replicas in captures.values():
        for name, profile in zip(profiles, entered):
            replicas[name].context = profile.context
    try:
        graphs, launch = gated_graphs(captures, plans, placement.home, profiles[placement.home].device, restores,
                                      None if whole is backends[home] else whole)
    except BaseException:
        for profile in entered:
            profile.__exit__(None, None, None)
        raise
    return PlacedBackend(backends, placement, graphs, monitor or Monitor(), launch, registry, weights_held=held,
                         whole=whole, slower=slower_under_load(found), skipped=skipped), entered


def holds_all(model: Any, names: set[str]) -> bool:
    """Whether ``names`` holds every parameter of ``model`` (a tied one under any of its names)."""
    owners: dict[int, set[str]] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(tensor), set()).add(name)
    return all(found & names for found in owners.values())


def free_bytes(gpu: int) -> int:
    """What GPU ``gpu`` can still give torch: the driver's free memory and what torch's allocator
    holds unused."""
    return torch.cuda.mem_get_info(gpu)[0] + torch.cuda.memory_reserved(gpu) - torch.cuda.memory_allocated(gpu)


def share(name: str, sizes: tuple[Footprint, Callable[[set[str]], int]], names: set[str] | None,
          kept: set[tuple[int, str]] | None, caches: int, slots: int, limit: int, where: str) -> None:
    """Device ``name``'s share (``names``' weights, None: all; the ``kept`` caches of the ``caches``,
    None: all, the others one scratch as large as one) checked against the ``limit`` bytes it may
    hold (``memory.checked_share``) before it loads."""
    footprint, reading = sizes
    every = slots * footprint.kv_bytes_per_slot
    cache = every if kept is None else every * (len(kept) + (len(kept) < caches)) // caches
    try:
        checked_share(name, footprint.weights_bytes if names is None else reading(names), cache,
                      footprint.workspace_bytes(slots), limit, where)
    except UsageError as exc:
        if names is not None:
            raise UsageError(f"{exc} (a device holds the weights its launches read in every bucket's and policy's "
                             "plan: make them agree with kernelfleet plan --weights-like ONE_PLAN.json)") from None
        raise UsageError(f"{exc} (it holds the whole model: a model larger than one device is served by --strategy "
                         "pipeline, or by plans made with kernelfleet plan --device NAME:MEMORY_GB on devices of one "
                         "GPU)") from None


def checked(found: dict, programs: dict[int, Any], memory: dict[str, int]) -> Any:
    """Every plan of ``found`` checked against its bucket's program (the plans' own, or the home
    device's capture) on devices of ``memory`` bytes, and their one KV placement
    (``placed_plans.kv_placement``)."""
    devices = [Device(d, size) for d, size in memory.items()]
    return kv_placement(found, {size: runtime_plans.problem(program, devices) for size, program in programs.items()})


def captured(backends: dict[str, EagerBackend], profiles: dict[str, Any], names: list[str], size: int,
             length: int | None = None, pools: dict[str, Any] | None = None) -> dict[str, Any]:
    """Bucket ``size``'s step attending ``length`` positions (None: the whole context) captured on
    each of ``names`` (``runtime/replicas.capture_each``, each in its pool of ``pools`` where given),
    its state not yet saved."""
    return capture_each(stepper([backends[n] for n in names], size, length), {n: profiles[n].device for n in names},
                        0, {n: profiles[n].kernels for n in names}, save=False, pools=pools)[0]


def shorter_buckets(backends: dict[str, EagerBackend], profiles: dict[str, Any], made: tuple[dict, dict, dict],
                    placement: Any, names: dict[str, set[str] | None], memory: dict[str, int], shorter: list[int],
                    told: Callable[[int, str], None]) -> list[str]:
    """Each batch bucket's step captured at each of the ``shorter`` context lengths into
    ``captures[size, length]``, and every plan of ``found`` carried there (``graph/units.carried``)
    into ``plans[size, length]`` (``made``: the plans read, and the captures and plans by (bucket,
    positions attended) so far, the whole context's); ``told(done, what)`` after each capture; what
    could not be carried, one line each (that context bucket is then not served: a step takes the
    next longer).

    A carried plan must pass the validator against its capture (``runtime/plans.checked``), keep
    every cache where ``placement`` has it, and read on each device only the weights it holds
    (``names``: None, all). Each device's shorter captures share one graph memory pool, captured
    largest first, so they keep about one step's activations between them, not one each (only one
    graph runs at a time)."""
    found, captures, plans = made
    skipped: list[str] = []
    if not shorter:
        return skipped
    pools = {name: torch.cuda.graph_pool_handle() for name in backends}
    devices = [Device(d, size) for d, size in memory.items()]
    home = placement.home
    done = len(captures)
    for size in sorted(found, reverse=True):
        whole = captures[size, backends[home].context_tokens]
        for length in sorted(shorter, reverse=True):
            short = aligned(captured(backends, profiles, list(backends), size, length, pools))
            done += 1
            told(done, described(size, length))
            try:
                problem = runtime_plans.problem(short[home].program, devices)  # once for both policies
                plans[size, length] = {policy: carried_plan(path, plan, whole, short, length, problem, placement, names)
                                       for policy, (path, plan) in found[size].items()}
            except UsageError as exc:
                skipped.append(f"{described(size, length)}: {exc}")
                continue
            captures[size, length] = short
    return skipped


def carried_plan(path: Path, plan: Any, whole: dict[str, Any], short: dict[str, Any], length: int,
                 problem: Any, placement: Any, names: dict[str, set[str] | None]) -> tuple[str, Any]:
    """``plan`` (made for the whole context's captures ``whole``) carried to the captures ``short``
    at ``length`` positions (:func:`shorter_buckets`; ``problem``: the validator's, over home's
    capture in ``short``), with where it came from; UsageError why not."""
    home = short[placement.home]
    where = f"{path}, carried to context {length}"
    source = whole[placement.home]
    moved = replace(plan, assignment=carried(plan.assignment, source.node_chains(), source.captured.raw,
                                             home.node_chains(), home.captured.raw))
    runtime_plans.checked(problem, moved, where)
    if kv_devices(home.program, moved.assignment, where) != placement.kv:
        raise UsageError(f"{where}: it keeps the KV cache elsewhere than the plans made for the whole context")
    for device, held in names.items():
        wanted = {n.removeprefix(WEIGHTS_PREFIX) for n in plan_weights(home.program, moved.assignment, device)
                  if n.startswith(WEIGHTS_PREFIX)}
        if held is not None and not wanted <= held:
            raise UsageError(f"{where}: {device} would read {min(wanted - held)}, which it does not hold")
    return where, moved


def same_gpu(one: int, other: int) -> bool:
    return one == other or torch.cuda.get_device_name(one) == torch.cuda.get_device_name(other)


def gated_graphs(captures: dict[tuple[int, int], dict[str, Any]], found: dict, home_name: str, gpu: int,
                 restores: list[Callable[[], None]], whole: EagerBackend | None = None
                 ) -> tuple[dict[tuple[int, int], dict[str, PlanGraph]], Callable[[Any], None]]:
    """Each (bucket, context bucket, policy) plan's graph (``captures`` and ``found``, the plans, by
    (bucket, positions attended)), built with resident state and gated (from the captured
    state, with the logits zeroed, it must give the home capture's own replay: bit for bit, or within
    the tolerance where the devices run different kernels), and the backend's ``launch``: a graph run
    on a stream of the home GPU, waited for. ``whole``: where home holds only part of the model, the
    reference is the same decode run eagerly on the shares joined (bit for bit, else within the
    tolerance: eager kernels against captured ones)."""
    stream = torch.cuda.Stream(device=gpu)

    def launch(built: Any) -> None:
        # after what the engine queued on the home device's stream: the inputs, prefills' row copies, row moves
        stream.wait_stream(torch.cuda.current_stream(gpu))
        run(built, stream.cuda_stream)
        stream.synchronize()

    graphs: dict[tuple[int, int], dict[str, PlanGraph]] = {}
    for (size, length), replicas in captures.items():
        home = replicas[home_name]
        graphs[size, length] = {}
        for policy, (path, plan) in found[size, length].items():
            units = home.units is not None
            built = build([Slot(replicas, plan.assignment, home_name)], resident_state=True, overlap=not units)
            restore_all(restores)
            if whole is None:
                with torch.cuda.device(gpu):
                    home.captured.replay()
                reference = home.captured.output_tensors()
            else:
                reference = [Bucket(size, home.captured.args[0], length).forward(whole)]
            torch.cuda.synchronize()
            reference = [t.clone() for t in reference]
            restore_all(restores)
            zero(home.captured.output_tensors())  # only a run that writes them matches
            launch(built)
            said = single_step_verdict(reference, home.captured.output_tensors(), units or whole is not None)
            restore_all(restores)
            if not passed(said):
                raise EnvironmentProblem(f"{path}: the plan's graph for {described(size, length)} does not give the "
                                         f"home device's own logits ({said}): the server does not serve it")
            graphs[size, length][policy] = PlanGraph(built, home.captured.args[0], home.captured.output_tensors()[0],
                                                     gate=said, length=length)
    return graphs, launch


def stepper(backends: list[EagerBackend], size: int, length: int | None = None) -> Callable[[str, int], Any]:
    """``make_step`` for ``capture_replicas``, which makes one step per device in the order of its
    devices: each call the next device's bucket-``size`` step attending ``length`` positions
    (partitions of one GPU share a torch device, so the device argument cannot tell them apart)."""
    order = iter(backends)
    return lambda device, seed: decode_step(next(order), size, length=length)


def placed_server(target: str, plans_root: Path, profiles: list[str], slots: int, max_queue: int,
                  context_tokens: int, token: str | None, seed: int, dtype: torch.dtype,
                  progress: Callable[[int, str], None] | None = None,
                  prefill: tuple[int | None, int | None] = (None, None),
                  caps: list[str] | None = None, shortest: int | None = None) -> tuple[Any, Any, list[Any]]:
    """``kernelfleet serve TARGET --plans DIR --profile ... --profile ... [--device NAME:MEMORY_GB
    ...]``: the started engine, its app and the entered device profiles (module docstring);
    ``prefill``: the engine's ``prefill_chunk_tokens`` and ``prefill_batch``; ``caps``: the
    ``--device`` caps of profiles, enforced on their GPUs (``device.enforce``); ``shortest``: the
    shortest context bucket the plans are carried to (``--shortest-context``; None: the whole context
    only); ``progress(done, what)`` after each capture."""
    from kernelfleet.errors import UsageError
    from kernelfleet.profile.run import parse_profile
    from kernelfleet.serve.api import serve_app
    from kernelfleet.serve.engine import Engine
    from kernelfleet.serve.metrics import ServeMetrics
    from kernelfleet.serve.model import described, footprint, load
    from kernelfleet.serve.parts import build_reading, reading_bytes, weight_bytes

    specs = [parse_profile(text) for text in profiles]
    if len(specs) < 2 or len({s.name for s in specs}) != len(specs):
        raise UsageError(f"--plans runs on two or more --profile NAME:SMS[+HOG]@GPU with the plans' device names, "
                         f"got {', '.join(profiles) or 'none'}")
    limits = capped({s.name: s.device for s in specs}, caps or [])
    metrics = ServeMetrics(max_queue)

    def load_model(device: str, names: set[str] | None) -> tuple[Any, int]:
        if names is not None:
            return build_reading(target, names, device, seed, dtype)
        model = load(target, device, seed, dtype).model
        return model, weight_bytes(model)

    sizes = footprint(target, dtype, context_tokens), (lambda names: reading_bytes(target, names, dtype))
    backend, entered = placed_backend(load_model, plans_root, {s.name: s for s in specs}, slots, context_tokens,
                                      metrics.registry, progress, sizes=sizes, caps=limits, shortest=shortest)
    engine = Engine(backend, max_queue, metrics, prefill_chunk_tokens=prefill[0], prefill_batch=prefill[1]).start()
    return engine, serve_app(engine, described(target), token), entered


def capped(gpus: dict[str, int], caps: list[str]) -> dict[str, int]:
    """``--device NAME:MEMORY_GB[@GPU]`` under ``--plans``: the bytes each named profile (``gpus``:
    its GPU by name) may hold, held to on its GPU (``device.enforce``: the caps of the profiles on
    one GPU add up); UsageError for a name no profile has, another GPU than its profile's, or a
    device capped twice."""
    from kernelfleet.serve.device import enforce, gpu_for
    from kernelfleet.serve.memory import DeviceCap, parse_device

    found: dict[str, DeviceCap] = {}
    for spec in caps:
        cap = parse_device(spec)
        if cap.name not in gpus:
            raise UsageError(f"--device {spec}: no --profile is named {cap.name} (profiles: {', '.join(gpus)})")
        if "@" in spec and cap.gpu != gpus[cap.name]:
            raise UsageError(f"--device {spec}: the profile {cap.name} is on GPU {gpus[cap.name]}")
        if cap.name in found:
            raise UsageError(f"--device {spec}: {cap.name} is capped twice")
        found[cap.name] = DeviceCap(cap.name, cap.memory_bytes, gpus[cap.name])
    enforce([gpu_for(cap) for cap in found.values()])
    return {name: cap.memory_bytes for name, cap in found.items()}
