"""``kernelfleet serve TARGET``: a model behind an OpenAI-compatible HTTP API.

It parses and prints only; the loop, the backends and the app are in ``serve/``. On a GPU (the
default) decode runs as captured graphs, one per batch and context bucket, with a progress bar while
they are captured; ``--cpu`` runs the model eagerly on the CPU. Every flag, and whether the model
fits the device's cap, is checked before the weights load, and the listening socket is bound before
them too, so a mistake or a port clash is one line at once; the listening rules (loopback by
default; another address needs ``--allow-remote`` and a token) are the agent's. ``--strategy`` with
``--device`` given twice runs request distribution, the prefill/decode split or the layer pipeline,
whose devices each build only their stage's part of the model (docs/serve.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from kernelfleet.cli_common import err
from kernelfleet.errors import UsageError
from kernelfleet.serve.scheduler import DEFAULT_PREFILL_BATCH, DEFAULT_PREFILL_CHUNK_TOKENS, checked_prefill

DTYPES = ("bfloat16", "float16", "float32")
CPU_SLOTS = 4  # the CPU's default: tiny models, a few requests at once
DeviceOption = typer.Option(None, "--device", show_default=False, help="NAME:MEMORY_GB[@GPU]: a GPU (default 0), its "
                            "name in the metrics, and the memory the weights and the KV cache must fit; twice or more "
                            "for --strategy replicas, split or pipeline (with --cpu: NAME:MEMORY_GB, CPU twins); with --plans, "
                            "NAME:MEMORY_GB caps the --profile NAME.")

PlansOption = typer.Option(None, "--plans", help="Decode through kernelfleet's plans: DIR/batch-B/ per batch bucket, "
                           "each with latency-greedy.json, throughput-milp.json and program.json (docs/serve.md).")
ProfileOption = typer.Option(None, "--profile", help="With --plans: NAME:SMS[+HOG]@GPU, each device the plans name "
                             "(twice or more; default, and --context's, what kernelfleet plan-serve made them for).")


def serve(
    target: str = typer.Argument(..., help="hf:DIR, a transformers causal LM directory (weights from its "
                                 "safetensors; random from --seed where it has only config.json)."),
    cpu: bool = typer.Option(False, "--cpu", help="Run the model eagerly on the CPU (no graphs)."),
    device: list[str] | None = DeviceOption,
    strategy: str = typer.Option("single", "--strategy", help="single | replicas (request distribution over the "
                                 "--device list) | split (prefill on the first --device, decode on the second) | "
                                 "pipeline (the layers cut into one stage a --device, in order)."),
    micro_batches: int | None = typer.Option(None, "--micro-batches", help="--strategy pipeline: decode groups in "
                                             "flight at once, so each stage runs one while the next runs another "
                                             "(default: 2 when every stage has a GPU of its own, else 1)."),
    listen: str = typer.Option("127.0.0.1:8000", "--listen", help="HOST:PORT of the API."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback listen address."),
    token: str | None = typer.Option(None, envvar="KERNELFLEET_TOKEN", help="Require this bearer token."),
    slots: int | None = typer.Option(None, "--slots", help="KV-cache slots: requests generating at once (default: "
                                     f"on a GPU as many as fit, at most 64; on the CPU {CPU_SLOTS}; with --plans the "
                                     "largest batch-B of the folder)."),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests waiting for a slot at most (then 429)."),
    context: int | None = typer.Option(None, "--context", help="Tokens per slot, prompt and output (default: the "
                                       "model's maximum, at most 4096)."),
    dtype: str | None = typer.Option(None, "--dtype", help=f"{'|'.join(DTYPES)} (default: bfloat16 on a GPU, "
                                     "float32 on the CPU)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights of a directory with only config.json."),
    prefill_chunk: int = typer.Option(DEFAULT_PREFILL_CHUNK_TOKENS, "--prefill-chunk", help="Prompt tokens prefilled a step "
                                      "at most, a long prompt in chunks over several steps: a bounded time per output "
                                      "token for a longer time to first token; 0 prefills whole prompts."),
    prefill_batch: int | None = typer.Option(None, "--prefill-batch", help="Whole prompts prefilled together in one "
                                             "forward at most (up to 4096 padded tokens): one forward's launches for "
                                             f"several newcomers (default {DEFAULT_PREFILL_BATCH}; 1 with "
                                             "--prefill-chunk, which it does not combine with; the split's prefill "
                                             "device holds that many staging slots)."),
    shortest_context: int | None = typer.Option(None, "--shortest-context", help="The shortest context bucket: "
                                                "decode graphs are captured at it, its doublings and --context, and a "
                                                "step replays the shortest that holds its requests' positions "
                                                "(default 128); --context itself: one bucket, every step attending the "
                                                "whole context. With --plans (default: the whole context only) each "
                                                "plan is carried to each shorter bucket's capture."),
    plans: Path | None = PlansOption,
    profile: list[str] | None = ProfileOption,
) -> None:
    """Serve a model: POST /v1/completions (OpenAI's API, streaming too), /v1/models, /healthz, /metrics."""
    from kernelfleet.fleet.listener import bind, given_token, listen_address

    devices = device or []
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype takes {', '.join(DTYPES)}, got {dtype!r}")
    from kernelfleet.serve.memory import parse_device
    from kernelfleet.serve.strategies import checked_strategy

    names = [parse_device(spec).name for spec in devices]
    if shortest_context is not None and shortest_context < 1:
        raise UsageError(f"--shortest-context takes 1 or more tokens, got {shortest_context}")
    if plans is not None or profile:  # its --device caps the profiles
        return _placed(target, plans, profile or [], devices, cpu or strategy != "single", listen,
                       allow_remote, token, slots, max_queue, context, dtype, seed,
                       (prefill_chunk, checked_prefill(prefill_chunk, prefill_batch)), shortest_context)
    checked_strategy(strategy, names)
    if cpu and devices and strategy == "single":
        raise UsageError("--device names a GPU; with --cpu the model runs on the CPU: pass one or the other")
    token = given_token(token)
    host, port = listen_address(listen, allow_remote, token)
    import torch

    from kernelfleet.serve.command import (
        Placed,
        checked_sizes,
        default_micro_batches,
        fitted,
        micro_batch_slots,
        part_words,
        parts_of,
        staged,
        twin_where,
    )
    from kernelfleet.serve.command import serve as run
    from kernelfleet.serve.device import enforce, gpu_for
    from kernelfleet.serve.model import described, load, max_context_tokens

    chosen = getattr(torch, dtype or ("float32" if cpu else "bfloat16"))
    # every flag is checked before the weights load: a mistake is one line at once
    tokens_per_slot = checked_sizes(slots, max_queue, context, max_context_tokens(target))
    if micro_batches is not None and micro_batches < 1:
        raise UsageError(f"--micro-batches must be at least 1, got {micro_batches}")
    staging = checked_prefill(prefill_chunk, prefill_batch)  # the split's prefill slots: one a prompt of a forward
    gpus = [] if cpu else [gpu_for(parse_device(spec)) for spec in devices] or [gpu_for(None)]
    if strategy == "pipeline":
        caps = [(cap.memory_bytes, twin_where(cap)) for cap in _cpu_caps(devices)] if cpu else \
            [(gpu.cap_bytes, gpu.where) for gpu in gpus]
        layers, slots = staged(target, caps, slots or (CPU_SLOTS if cpu else None), chosen, tokens_per_slot)
    elif cpu:
        twins = _twins(devices, strategy, slots or CPU_SLOTS, staging)
        slots = sum(n for _, n in twins[strategy == "split":])
    else:
        sized = fitted(gpus, target, strategy, slots, chosen, tokens_per_slot, staging)
        slots = sum(n for n, _ in sized[strategy == "split":])
    sock = bind(host, port)
    try:
        if strategy == "pipeline":
            names = [parse_device(spec).name for spec in devices]
            if not cpu:
                enforce(gpus)
            torch_devices = ["cpu"] * len(names) if cpu else [g.torch_device for g in gpus]
            placed = parts_of(target, names, torch_devices, layers, slots, seed, chosen)
            served = described(target)
            micro_batches = micro_batches or default_micro_batches(torch_devices)
            groups = len(micro_batch_slots(slots, micro_batches))
            where = ", ".join(f"{name}: {part_words(p.model)}" for name, p in zip(names, placed))
            where += f"; {groups} micro-batch{'es' * (groups != 1)}"
        elif cpu:
            served = load(target, "cpu", seed, chosen)
            placed = [Placed(name, served.model, n) for name, n in twins]  # the CPU twins share one copy of the weights
            where = ", ".join(f"{name} ({n} slots)" for name, n in twins) if devices else "the CPU"
        else:
            enforce([gpu for _, gpu in sized])
            loaded = [(load(target, gpu.torch_device, seed, chosen), n, gpu) for n, gpu in sized]
            served = loaded[0][0]
            placed = [Placed(gpu.name, model.model, n) for model, n, gpu in loaded]
            where = ", ".join(f"{gpu.described}: {n} slots" for n, gpu in sized) if devices[1:] else sized[0][1].described
        started = time.perf_counter()
        engine, app = _built(served, slots, max_queue, tokens_per_slot, token, not cpu, strategy,
                             placed if devices else [], gpus[0].name if gpus else None, micro_batches, prefill_chunk,
                             prefill_batch, shortest_context)
    except BaseException:
        sock.close()
        raise
    backends = [] if cpu else engine.strategy.backends
    for backend in backends[:1] if strategy == "pipeline" else backends:
        sizes, lengths = (", ".join(map(str, values)) for values in (backend.sizes, backend.lengths))
        on = f" on {backend.device}" if devices[1:] else ""
        if strategy == "pipeline":
            on = f" of each stage ({', '.join(s.name for s in backend.stages)}) and micro-batch group"
        err.print(f"kernelfleet serve: decode graphs of batch buckets {sizes} and context buckets {lengths}{on} "
                  f"captured in {time.perf_counter() - started:.1f} s", markup=False, highlight=False)
    how = f"{strategy}: " if strategy != "single" else ""
    err.print(f"kernelfleet serve: {served.name} on http://{host}:{port}/v1 ({slots} slots of "
              f"{engine.context_tokens} tokens, {how}{where})", markup=False, highlight=False)
    run(engine, app, sock)


def _placed(target: str, plans: Path | None, profiles: list[str], caps: list[str], other: bool, listen: str,
            allow_remote: bool, token: str | None, slots: int | None, max_queue: int, context: int | None,
            dtype: str | None, seed: int, prefill: tuple[int | None, int], shortest: int | None) -> None:
    """``--plans DIR --profile ...``: the placed backend (serve/placed_build.py) behind the same API;
    ``caps``: ``--device NAME:MEMORY_GB``, what a profile may hold; ``prefill``: the engine's prompt
    tokens a step and whole prompts a forward (engine.py); ``shortest``: the shortest context bucket
    the plans are carried to (None: the whole context only). A progress bar runs over the captures."""
    from kernelfleet.fleet.listener import bind, given_token, listen_address

    if plans is None or other:
        raise UsageError("--plans DIR and --profile go together, on GPUs, without --cpu or --strategy")
    from kernelfleet.serve.plan_buckets import made_for, on_gpu

    made = made_for(plans)
    if made is not None:  # made by plan-serve: its profiles and context unless given, and no others
        profiles = profiles or [on_gpu(spec) for spec in made["profiles"]]
        context = context or made["context"]
        wrong = [f"--{flag} {given}" for flag, given in (("slots", slots), ("context", context))
                 if given is not None and given != made[flag]]
        if wrong:
            raise UsageError(f"--plans {plans} was made for {made['slots']} slots of {made['context']} tokens "
                             f"(kernelfleet plan-serve), not {' and '.join(wrong)}: serve it with those, or make "
                             "plans for these")
    import torch

    from kernelfleet.serve.command import checked_sizes
    from kernelfleet.serve.command import serve as run
    from kernelfleet.serve.graphs import buckets, lengths
    from kernelfleet.serve.model import max_context_tokens
    from kernelfleet.serve.placed_build import placed_server
    from kernelfleet.serve.placed_plans import planned_slots

    tokens_per_slot = checked_sizes(slots, max_queue, context, max_context_tokens(target))
    slots = slots or planned_slots(plans)
    token = given_token(token)
    sock = bind(*listen_address(listen, allow_remote, token))
    started = time.perf_counter()
    total = len(buckets(slots)) * len(lengths(tokens_per_slot, shortest or tokens_per_slot))
    try:
        with _capturing(total, "placed step") as progress:
            engine, app, entered = placed_server(target, plans, profiles, slots, max_queue, tokens_per_slot,
                                                 token, seed, getattr(torch, dtype or "bfloat16"), progress,
                                                 prefill=prefill, caps=caps, shortest=shortest)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    backend = engine.backend
    contexts = sorted({length for _, length in backend.graphs})
    err.print(f"kernelfleet serve: {target} through the plans of {plans} on {', '.join(profiles)} "
              f"(batch buckets {', '.join(map(str, backend.sizes))}, context buckets {', '.join(map(str, contexts))}, "
              f"captured and gated in {time.perf_counter() - started:.1f} s) on http://{host}:{port}/v1",
              markup=False, highlight=False)
    for said in backend.skipped:
        err.print(f"  not carried, served at the next longer context: {said}", markup=False, highlight=False)
    from kernelfleet.serve.parts import weight_bytes

    held, home = engine.backend.weights_held, engine.backend.placement.home
    whole = weight_bytes(engine.backend.whole.model)
    err.print("  weights held: " + ", ".join(f"{name} {size / 2**30:.2f} GiB ({size / whole:.0%})"
                                             for name, size in held.items())
              + (f" (the home device, {home}, holds them all: prefill runs there)" if held[home] >= whole else
                 f" (prefill runs on the home device, {home}, over every device's share)"),
              markup=False, highlight=False)
    for said, graphs in engine.backend.gates().items():
        err.print(f"  gate: {said}: {len(graphs)} plan graph{'s' if len(graphs) > 1 else ''} ({', '.join(graphs)})",
                  markup=False, highlight=False)
    slower = [f"bucket {size} (the throughput plan's step {wide * 1e3:.2f} ms, the latency plan's {fast * 1e3:.2f})"
              for size, wide, fast in engine.backend.slower]
    if slower:
        err.print(f"  under load slower: {', '.join(slower)}; this server runs one batch a step, so the throughput "
                  "plan's steps cost their latency: plans made with kernelfleet plan --in-flight 1 do not",
                  markup=False, highlight=False)
    try:
        run(engine, app, sock)
    finally:
        for profile in entered:
            profile.__exit__(None, None, None)


def _cpu_caps(devices: list[str]) -> list:
    """The CPU twins' ``--device NAME:MEMORY_GB`` (no @GPU on a CPU)."""
    from kernelfleet.serve.memory import parse_device

    if any("@" in spec for spec in devices):
        raise UsageError("with --cpu a --device is a CPU twin, NAME:MEMORY_GB: it has no @GPU")
    return [parse_device(spec) for spec in devices]


def _twins(devices: list[str], strategy: str, slots: int, staging: int = 1) -> list[tuple[str | None, int]]:
    """The CPU's devices (``--cpu``): without ``--device`` the CPU itself with ``slots``; otherwise
    each ``NAME:MEMORY_GB`` a twin of its own KV cache, the slots split as on GPUs (memory.py,
    command.fitted; the split's prefill twin ``staging`` slots), nothing enforcing the memory (under
    ``pipeline`` the caps choose the cut and are checked)."""
    from kernelfleet.serve.memory import proportional_slots

    if not devices:
        return [(None, slots)]
    caps = _cpu_caps(devices)
    counts = [staging, slots] if strategy == "split" else proportional_slots(slots, [cap.memory_bytes for cap in caps])
    return [(cap.name, n) for cap, n in zip(caps, counts)]


def _built(served, slots: int, max_queue: int, context: int, token: str | None, graphs: bool, strategy: str,
           devices: list, name: str | None, micro_batches: int | None, prefill_chunk_tokens: int,
           prefill_batch: int | None, shortest_context: int | None):
    """The engine and app (``serve.command.build``) over ``devices`` (``serve.command.Placed``), with
    a progress bar over the buckets while a GPU's graphs are captured."""
    from kernelfleet.serve.command import build, micro_batch_slots
    from kernelfleet.serve.graphs import SHORTEST_CONTEXT, buckets, lengths

    shortest = shortest_context or SHORTEST_CONTEXT
    options = {"strategy": strategy, "devices": devices, "device_name": name, "micro_batches": micro_batches,
               "prefill_chunk_tokens": prefill_chunk_tokens, "prefill_batch": prefill_batch, "shortest": shortest}
    if not graphs:
        return build(served, slots, max_queue, context, token, **options)
    if strategy == "pipeline":
        decoding = micro_batch_slots(slots, micro_batches)
    else:
        decoding = [device.slots for device in devices[strategy == "split":]] or [slots]
    with _capturing(sum(len(buckets(n)) for n in decoding) * len(lengths(context, shortest)), "decode graph") as told:
        return build(served, slots, max_queue, context, token, graphs=True, **options, progress=told)


@contextmanager
def _capturing(total: int, what: str) -> Iterator[Callable[[int, str], None]]:
    """A progress bar over ``total`` captures while the block runs, and its ``progress(done, bucket)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(f"capturing the {what}s", total=total)
        yield lambda done, bucket: bar.update(task, completed=done, description=f"captured the {what} of {bucket}")
