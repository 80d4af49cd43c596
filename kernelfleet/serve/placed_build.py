"""What ``kernelfleet serve hf:DIR --plans DIR --profile A --profile B`` builds on the GPU: the placed
backend's devices, captures, plan graphs and gate (``placed.py`` runs them).

In order, each failure one line: the plan folder is read (``placed_plans.read``) before any weight
loads; the home device (``--profile NAME:SMS[+HOG]@GPU``, a green-context partition as the place
commands take it), once the model and the server's slots fit its GPU's free memory
(``memory.planned_slots``), loads the whole model (prefill runs there) with a cache of those slots
and captures every batch bucket's decode step (``placed_step.decode_step``,
``runtime/replicas.capture_each``) on the whole GPU; every plan is checked against its bucket's
capture and for one KV placement (``placed_plans.kv_placement``); then each other device, once its
share fits what its GPU has left (``memory.checked_share``), loads the weights its launches read in
some plan (``placed_plans.weights_read``, ``parts.build_reading``; all of them where it captures
other kernels than home: its units are matched only after capture) and captures the buckets too; the
state every capture writes (each device's cache) is saved once; the partitions are carved; then each
(bucket, policy) graph is built with ``resident_state`` and gated: run from the saved state, its
logits must equal the home device's own replay of that capture bit for bit, or, where the devices
captured different kernels (a ``--profile`` with ``/KERNELS``, or another GPU type), agree with it
within the place gate's tolerance (``runtime/gate.single_step_verdict``: logits cosine and
near-ties, over this one decode step); otherwise the server does not start. Each graph keeps its
verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.kernels.cuda.replay import saved_state
from kernelfleet.plan.model import Device
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.executor import Slot, build, run
from kernelfleet.runtime.gate import passed, single_step_verdict
from kernelfleet.runtime.monitor import Monitor
from kernelfleet.runtime.replicas import aligned, capture_each, restore_all
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.cache import SlotCache
from kernelfleet.serve.graphs import buckets
from kernelfleet.serve.memory import Footprint, checked_share, planned_slots
from kernelfleet.serve.placed import PlacedBackend, PlanGraph
from kernelfleet.serve.placed_plans import kv_placement, plans_home, read, weights_read
from kernelfleet.serve.placed_step import WEIGHTS_PREFIX, decode_step


def placed_backend(load_model: Callable[[str, set[str] | None], tuple[Any, int]], plans_root: Path,
                   profiles: dict[str, Any], slots: int, context_tokens: int, registry: Any = None,
                   progress: Callable[[int, int], None] | None = None, monitor: Monitor | None = None, *,
                   sizes: tuple[Footprint, Callable[[set[str]], int]]) -> tuple[PlacedBackend, list[Any]]:
    """The placed backend (module docstring) and the entered ``profile.devices.DeviceProfile`` of each
    device (keep them entered while it serves). ``load_model(torch device, names)`` loads the model
    there, holding only the weights ``names`` (None: all), with the bytes of weights it holds;
    ``profiles``: ``profile.devices.ProfileSpec`` by the names the plans use; ``sizes``: the model's
    footprint and the bytes ``load_model`` allocates for ``names``, to check that each device's share
    fits its GPU's free memory before it loads."""
    found = read(plans_root, buckets(slots))  # before any weight loads
    from kernelfleet.profile.devices import DeviceProfile

    home = plans_home(found, next(iter(profiles)))
    if home not in profiles:
        raise UsageError(f"--plans {plans_root}: the plans' home is {home}, which no --profile names "
                         f"({', '.join(profiles)})")
    memory = {name: torch.cuda.get_device_properties(spec.device).total_memory for name, spec in profiles.items()}
    # where every device captures the home's kernels, the plans are checked on home's capture alone and each
    # other device then holds only the weights its launches read in some plan; with other kernels the plans
    # place units, matched only once every device has captured, so each device holds them all
    partial = all(spec.kernels == profiles[home].kernels and same_gpu(spec.device, profiles[home].device)
                  for spec in profiles.values())
    backends, held = {}, {}
    try:  # home holds the whole model and every slot's cache
        planned_slots(sizes[0], free_bytes(profiles[home].device), slots,
                      f"under the free memory of GPU {profiles[home].device} on the home device {home}, which holds "
                      "the whole model (prefill runs there)")
    except UsageError as exc:
        raise UsageError(f"{exc} (a model larger than one device is served by --strategy pipeline, each device "
                         "holding its stage's layers)") from None
    model, held[home] = load_model(f"cuda:{profiles[home].device}", None)
    backends[home] = EagerBackend(model, slots, context_tokens, home)
    captures = {size: captured(backends, profiles, [home], size) for size in found}
    placement = checked(found, captures, home, memory) if partial else None
    regions = {size: (replicas[home].program, replicas[home].captured.raw.regions)
               for size, replicas in captures.items()} if partial else {}
    for name, spec in profiles.items():
        if name != home:
            names = weights_read(found, regions, name, WEIGHTS_PREFIX) if partial else None
            # the caches the plans keep here; where they are not known yet (units), all
            kept = set(placement.away().get(name, [])) if placement else None
            share(name, spec.device, sizes, names, kept, backends[home].cache, slots)
            model, held[name] = load_model(f"cuda:{spec.device}", names)
            backends[name] = EagerBackend(model, slots, context_tokens, name, kept)
    programs = []
    for done, size in enumerate(found, 1):
        replicas = {**captures[size], **captured(backends, profiles, [n for n in profiles if n != home], size)}
        programs += [r.program for r in replicas.values()]
        captures[size] = aligned(replicas)
        if partial and captures[size][home].units is not None:
            raise EnvironmentProblem(f"batch bucket {size}: the devices captured different kernels although their "
                                     "profiles ask for the same ones; give the other device its /KERNELS")
        (progress or (lambda done, size: None))(done, size)
    placement = placement or checked(found, captures, home, memory)
    # every bucket's capture on a device writes the same cache: the state is saved once, not once a capture
    restores = [saved_state(programs)]
    # the partitions are carved once every capture is made, on the whole GPU, as runtime/gate.py does
    entered = [DeviceProfile(spec).__enter__() for spec in profiles.values()]
    for replicas in captures.values():
        for name, profile in zip(profiles, entered):
            replicas[name].context = profile.context
    try:
        graphs, launch = gated_graphs(captures, found, placement.home, profiles[placement.home].device, restores)
    except BaseException:
        for profile in entered:
            profile.__exit__(None, None, None)
        raise
    return PlacedBackend(backends, placement, graphs, monitor or Monitor(), launch, registry,
                         weights_held=held), entered


def free_bytes(gpu: int) -> int:
    """What GPU ``gpu`` can still give torch: the driver's free memory and what torch's allocator
    holds unused."""
    return torch.cuda.mem_get_info(gpu)[0] + torch.cuda.memory_reserved(gpu) - torch.cuda.memory_allocated(gpu)


def share(name: str, gpu: int, sizes: tuple[Footprint, Callable[[set[str]], int]], names: set[str] | None,
          kept: set[tuple[int, str]] | None, home: SlotCache, slots: int) -> None:
    """Device ``name``'s share (``names``' weights, None: all; the ``kept`` caches, None: all, each
    the size of ``home``'s, the others one scratch) checked against its GPU's free memory
    (``memory.checked_share``) before it loads."""
    footprint, reading = sizes
    one = next(iter(home.keys.values()))  # one layer's keys (or values) of every slot
    each = one.numel() * one.element_size()
    caches = 2 * len(home.keys)
    count = caches if kept is None else len(kept) + (len(kept) < caches)
    checked_share(name, footprint.weights_bytes if names is None else reading(names), count * each,
                  footprint.workspace_bytes(slots), free_bytes(gpu), f"under the free memory of GPU {gpu}")


def checked(found: dict, captures: dict[int, dict[str, Any]], home: str, memory: dict[str, int]) -> Any:
    """Every plan of ``found`` checked against its bucket's capture on ``home``, and their one KV
    placement (``placed_plans.kv_placement``)."""
    devices = [Device(d, size) for d, size in memory.items()]
    return kv_placement(found, {size: runtime_plans.problem(replicas[home].program, devices)
                                for size, replicas in captures.items()})


def captured(backends: dict[str, EagerBackend], profiles: dict[str, Any], names: list[str], size: int) -> dict[str, Any]:
    """Bucket ``size``'s step captured on each of ``names`` (``runtime/replicas.capture_each``), its state not yet saved."""
    return capture_each(stepper([backends[n] for n in names], size), {n: profiles[n].device for n in names}, 0,
                        {n: profiles[n].kernels for n in names}, save=False)[0]


def same_gpu(one: int, other: int) -> bool:
    return one == other or torch.cuda.get_device_name(one) == torch.cuda.get_device_name(other)


def gated_graphs(captures: dict[int, dict[str, Any]], found: dict, home_name: str, gpu: int,
                 restores: list[Callable[[], None]]) -> tuple[dict[int, dict[str, PlanGraph]], Callable[[Any], None]]:
    """Each (bucket, policy) plan's graph, built with resident state and gated (from the captured
    state, with the logits zeroed, it must give the home capture's own replay: bit for bit, or within
    the tolerance where the devices run different kernels), and the backend's ``launch``: a graph run
    on a stream of the home GPU, waited for."""
    stream = torch.cuda.Stream(device=gpu)

    def launch(built: Any) -> None:
        # after what the engine queued on the home device's stream: the inputs, prefills' row copies, row moves
        stream.wait_stream(torch.cuda.current_stream(gpu))
        run(built, stream.cuda_stream)
        stream.synchronize()

    graphs: dict[int, dict[str, PlanGraph]] = {}
    for size, replicas in captures.items():
        home = replicas[home_name]
        graphs[size] = {}
        for policy, (path, plan) in found[size].items():
            units = home.units is not None
            built = build([Slot(replicas, plan.assignment, home_name)], resident_state=True, overlap=not units)
            restore_all(restores)
            with torch.cuda.device(gpu):
                home.captured.replay()
            torch.cuda.synchronize()
            reference = [t.clone() for t in home.captured.output_tensors()]
            restore_all(restores)
            with torch.inference_mode():  # the logits are an inference tensor; zeroed, only a run that writes them matches
                for tensor in home.captured.output_tensors():
                    tensor.zero_()
            launch(built)
            said = single_step_verdict(reference, home.captured.output_tensors(), units)
            restore_all(restores)
            if not passed(said):
                raise EnvironmentProblem(f"{path}: the plan's graph for batch bucket {size} does not give the home "
                                         f"device's own logits ({said}): the server does not serve it")
            graphs[size][policy] = PlanGraph(built, home.captured.args[0], home.captured.output_tensors()[0],
                                             gate=said)
    return graphs, launch


def stepper(backends: list[EagerBackend], size: int) -> Callable[[str, int], Any]:
    """``make_step`` for ``capture_replicas``, which makes one step per device in the order of its
    devices: each call the next device's bucket-``size`` step (partitions of one GPU share a torch
    device, so the device argument cannot tell them apart)."""
    order = iter(backends)
    return lambda device, seed: decode_step(next(order), size)


def placed_server(target: str, plans_root: Path, profiles: list[str], slots: int, max_queue: int,
                  context_tokens: int, token: str | None, seed: int, dtype: torch.dtype,
                  progress: Callable[[int, int], None] | None = None,
                  prefill: tuple[int | None, int | None] = (None, None)) -> tuple[Any, Any, list[Any]]:
    """``kernelfleet serve TARGET --plans DIR --profile ... --profile ...``: the started engine, its
    app and the entered device profiles (module docstring); ``prefill``: the engine's
    ``prefill_chunk_tokens`` and ``prefill_batch``."""
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
    metrics = ServeMetrics(max_queue)

    def load_model(device: str, names: set[str] | None) -> tuple[Any, int]:
        if names is not None:
            return build_reading(target, names, device, seed, dtype)
        model = load(target, device, seed, dtype).model
        return model, weight_bytes(model)

    sizes = footprint(target, dtype, context_tokens), (lambda names: reading_bytes(target, names, dtype))
    backend, entered = placed_backend(load_model, plans_root, {s.name: s for s in specs}, slots, context_tokens,
                                      metrics.registry, progress, sizes=sizes)
    engine = Engine(backend, max_queue, metrics, prefill_chunk_tokens=prefill[0], prefill_batch=prefill[1]).start()
    return engine, serve_app(engine, described(target), token), entered
