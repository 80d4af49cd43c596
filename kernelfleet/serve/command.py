"""What ``kernelfleet serve TARGET`` runs: load the model, start the loop, serve the API.

The CLI checks the options and prints; :func:`build` makes the engine and the app (the tests and
the benchmark start the same pair on a free port), :func:`serve` runs them on a bound socket until
interrupted (the CLI binds before it loads the model, so a port clash is one line at once).
On a GPU the backend is the graph backend (``graphs.py``); on the CPU the eager one, or, with
``graphs=True``, the graph backend's CPU twin (the same buckets and padding, nothing captured).
``--strategy`` and its ``--device``s pick how the backends share the work (``strategies.py``);
under ``pipeline`` each device holds only its stage's part (:func:`staged` cuts, :func:`parts_of` builds).
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import FastAPI

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet.listener import Listener
from kernelfleet.serve.api import serve_app
from kernelfleet.serve.backend import Backend, EagerBackend
from kernelfleet.serve.device import Gpu
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.graphs import SHORTEST_CONTEXT, GraphBackend
from kernelfleet.serve.memory import GIB, DeviceCap, planned_slots, proportional_slots
from kernelfleet.serve.model import DEFAULT_CONTEXT_TOKENS, Served, footprint
from kernelfleet.serve.strategies import checked_strategy, pipeline, replicas, single, split


def checked_sizes(slots: int | None, max_queue: int, context_tokens: int | None, max_context_tokens: int) -> int:
    """The tokens per slot (``context_tokens``, or the model's maximum up to a default), once the
    sizes make sense (UsageError naming the flag otherwise); ``slots`` None: sized later, from memory."""
    if (slots is not None and slots < 1) or max_queue < 0:
        raise UsageError(f"--slots must be at least 1 and --max-queue at least 0, got {slots} and {max_queue}")
    context = context_tokens or min(max_context_tokens, DEFAULT_CONTEXT_TOKENS)
    if not 1 < context <= max_context_tokens:
        raise UsageError(f"--context must be from 2 to the model's {max_context_tokens} tokens, got {context}")
    return context


def fitted(gpus: list[Gpu], target: str, strategy: str, slots: int | None, dtype: torch.dtype,
           context_tokens: int, staging: int = 1) -> list[tuple[int, Gpu]]:
    """Each ``--device``'s GPU (``gpus``: device.gpu_for each) and its slots, once the model fits each cap: checked
    from the config, before any weight loads (memory.py). ``slots`` is the whole server's: under
    ``replicas`` split in proportion to the caps (None: each device as many as fit), under ``split``
    the decode device's (the prefill device holds ``staging`` slots, one a prompt of a batched prefill)."""
    if strategy == "split":
        wanted = [staging, slots]
    elif slots is not None and len(gpus) > 1:
        wanted = proportional_slots(slots, [gpu.cap_bytes for gpu in gpus])
    else:
        wanted = [slots] * len(gpus)
    need = footprint(target, dtype, context_tokens)
    return [(planned_slots(need, gpu.cap_bytes, n, gpu.where), gpu) for gpu, n in zip(gpus, wanted)]


def twin_where(cap: DeviceCap) -> str:
    """A CPU twin's cap in words, for messages (device.Gpu.where's, for a twin)."""
    return f"under the cap of {cap.name} (a CPU twin, {cap.memory_bytes / GIB:.2f} GiB)"


def part_words(part: Any) -> str:
    """What a stage's part holds, in words (cut.described)."""
    from kernelfleet.serve.cut import described

    return described(part.layers, part.first, part.last)


def staged(target: str, caps: list[tuple[int, str]], slots: int | None, dtype: torch.dtype,
           context_tokens: int) -> tuple[list[range], int]:
    """``--strategy pipeline``'s cut over devices of ``caps`` (bytes, and "under the cap of ..." for
    messages) and the slots every stage holds, checked from the config before any weight loads (cut.py)."""
    from kernelfleet.serve.cut import cut
    from kernelfleet.serve.parts import stage_sizes

    return cut(stage_sizes(target, dtype, context_tokens), [b for b, _ in caps], slots, [w for _, w in caps])


def parts_of(target: str, names: list[str], torch_devices: list[str], layers: list[range], slots: int, seed: int,
             dtype: torch.dtype) -> list[Placed]:
    """Each stage's part built on its own device (parts.py), as ``build``'s ``devices``."""
    from kernelfleet.serve.parts import build_part

    return [Placed(name, build_part(target, stage, device, seed, dtype), slots)
            for name, device, stage in zip(names, torch_devices, layers)]


def default_micro_batches(torch_devices: list[str]) -> int:
    """``--micro-batches``' default: 2 where every stage has a GPU of its own (their stages run side
    by side), else 1. Stages that share a device cannot overlap, and each more group only splits the
    batch (each group reads all the weights again); on the CPU two groups cost up to 40 % of tokens/s
    (docs/serve.md)."""
    distinct = len(set(torch_devices)) == len(torch_devices)
    return 2 if distinct and all(device.startswith("cuda") for device in torch_devices) else 1


def micro_batch_slots(slots: int, micro_batches: int) -> list[int]:
    """The slots of each micro-batch group of the pipeline: ``slots`` split evenly (fewer groups when
    there are fewer slots)."""
    return proportional_slots(slots, [1.0] * min(micro_batches, slots))


@dataclass(frozen=True)
class Placed:
    """One device of a strategy: its name in the metrics (None: torch's), the model loaded there (under
    ``pipeline`` its stage's ``parts.Part``), its slots."""

    name: str | None
    model: Any
    slots: int


def build(served: Served, slots: int, max_queue: int, context_tokens: int | None = None,
          token: str | None = None, graphs: bool = False, progress: Callable[[int, str], None] | None = None,
          device_name: str | None = None, strategy: str = "single", devices: Sequence[Placed] = (),
          micro_batches: int | None = None, prefill_chunk_tokens: int | None = None,
          prefill_batch: int | None = None, shortest: int = SHORTEST_CONTEXT) -> tuple[Engine, FastAPI]:
    """A started engine over ``served`` and its app: eagerly, or with ``graphs`` through the graph
    backend (captured where the model is on a GPU; ``progress(done, what)`` after each capture).
    ``devices`` (default: ``served``'s model with ``slots``, named ``device_name``) are the
    strategy's, in ``--device`` order: under ``split`` the prefill device, then the decode one; under
    ``pipeline`` the stages, whose ``slots`` are split into ``micro_batches`` groups (pipeline.py;
    None: :func:`default_micro_batches`); the engine prefills at most ``prefill_chunk_tokens`` prompt
    tokens a step (None or 0: whole prompts, ``prefill_batch`` of them a forward at most; engine.py);
    ``shortest``: the shortest context bucket of the decode graphs (``graphs.lengths``)."""
    context = checked_sizes(slots, max_queue, context_tokens, served.max_context_tokens)
    placed = list(devices) or [Placed(device_name, served.model, slots)]
    checked_strategy(strategy, [device.name for device in devices])
    counted = itertools.count(1)  # one progress count over every device's buckets
    told = None if progress is None else (lambda done, what: progress(next(counted), what))

    def decoding(device: Placed) -> Backend:
        eager = EagerBackend(device.model, device.slots, context, device.name)
        if not graphs:
            return eager
        return GraphBackend(eager, told, graphs=eager.torch_device.startswith("cuda"), device_name=device.name,
                            shortest=shortest)

    if strategy == "pipeline":
        from kernelfleet.serve.pipeline import PipelineBackend, Stage

        stages = [Stage(device.model, device.name) for device in placed]
        micro_batches = micro_batches or default_micro_batches([stage.torch_device for stage in stages])
        if micro_batches < 1:
            raise UsageError(f"--micro-batches must be at least 1, got {micro_batches}")
        groups = micro_batch_slots(slots, micro_batches)
        plan = pipeline([PipelineBackend(stages, n, context, graphs, told, shortest=shortest) for n in groups])
    elif strategy == "split":  # the prefill device runs prompts only: eagerly, into its staging slots
        plan = split(EagerBackend(placed[0].model, placed[0].slots, context, placed[0].name), decoding(placed[1]))
    elif strategy == "replicas":
        plan = replicas([decoding(device) for device in placed])
    else:
        plan = single(decoding(placed[0]))
    engine = Engine(plan, max_queue, prefill_chunk_tokens=prefill_chunk_tokens, prefill_batch=prefill_batch).start()
    return engine, serve_app(engine, served, token)


def serve(engine: Engine, app: FastAPI, sock: socket.socket) -> None:
    """Serve ``app`` on the bound ``sock`` until Ctrl-C, or until the server or the loop dies."""
    server = Listener(app, sock).start()
    stop = threading.Event()
    server.stops(stop)
    interrupted = False
    try:
        while not stop.wait(1.0) and engine.alive():
            pass
    except KeyboardInterrupt:
        interrupted = True
    finally:
        server.stop()
        engine.close()
    if not interrupted:
        host, port = sock.getsockname()[:2]
        raise EnvironmentProblem(f"the server on {host}:{port} or its generation loop stopped (see the log above)")
