"""What ``kernelfleet serve TARGET`` runs: load the model, start the loop, serve the API.

The CLI checks the options and prints; :func:`build` makes the engine and the app (the tests and
the benchmark start the same pair on a free port), :func:`serve` runs them on a bound socket until
interrupted (the CLI binds before it loads the model, so a port clash is one line at once).
On a GPU the backend is the graph backend (``graphs.py``); on the CPU the eager one, or, with
``graphs=True``, the graph backend's CPU twin (the same buckets and padding, nothing captured).
``--strategy`` and its ``--device``s pick how the backends share the work (``strategies.py``).
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
from kernelfleet.serve.device import Gpu, gpu_for
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.graphs import GraphBackend
from kernelfleet.serve.memory import parse_device, planned_slots, proportional_slots
from kernelfleet.serve.model import DEFAULT_CONTEXT_TOKENS, Served, footprint
from kernelfleet.serve.strategies import checked_strategy, replicas, single, split


def checked_sizes(slots: int | None, max_queue: int, context_tokens: int | None, max_context_tokens: int) -> int:
    """The tokens per slot (``context_tokens``, or the model's maximum up to a default), once the
    sizes make sense (UsageError naming the flag otherwise); ``slots`` None: sized later, from memory."""
    if (slots is not None and slots < 1) or max_queue < 0:
        raise UsageError(f"--slots must be at least 1 and --max-queue at least 0, got {slots} and {max_queue}")
    context = context_tokens or min(max_context_tokens, DEFAULT_CONTEXT_TOKENS)
    if not 1 < context <= max_context_tokens:
        raise UsageError(f"--context must be from 2 to the model's {max_context_tokens} tokens, got {context}")
    return context


def fitted(target: str, devices: list[str], strategy: str, slots: int | None, dtype: torch.dtype,
           context_tokens: int) -> list[tuple[int, Gpu]]:
    """Each ``--device``'s GPU (GPU 0 without one) and its slots, once the model fits each cap: checked
    from the config, before any weight loads (memory.py). ``slots`` is the whole server's: under
    ``replicas`` split in proportion to the caps (None: each device as many as fit), under ``split``
    the decode device's (the prefill device holds one staging slot)."""
    gpus = [gpu_for(parse_device(d)) for d in devices] or [gpu_for(None)]
    if strategy == "split":
        wanted = [1, slots]
    elif slots is not None and len(gpus) > 1:
        wanted = proportional_slots(slots, [gpu.cap_bytes for gpu in gpus])
    else:
        wanted = [slots] * len(gpus)
    need = footprint(target, dtype, context_tokens)
    return [(planned_slots(need, gpu.cap_bytes, n, gpu.where), gpu) for gpu, n in zip(gpus, wanted)]


@dataclass(frozen=True)
class Placed:
    """One device of a strategy: its name in the metrics (None: torch's), the model loaded there, its slots."""

    name: str | None
    model: Any
    slots: int


def build(served: Served, slots: int, max_queue: int, context_tokens: int | None = None,
          token: str | None = None, graphs: bool = False, progress: Callable[[int, int], None] | None = None,
          device_name: str | None = None, strategy: str = "single", devices: Sequence[Placed] = ()
          ) -> tuple[Engine, FastAPI]:
    """A started engine over ``served`` and its app: eagerly, or with ``graphs`` through the graph
    backend (captured where the model is on a GPU; ``progress(done, bucket)`` after each bucket).
    ``devices`` (default: ``served``'s model with ``slots``, named ``device_name``) are the
    strategy's, in ``--device`` order: under ``split`` the prefill device, then the decode one."""
    context = checked_sizes(slots, max_queue, context_tokens, served.max_context_tokens)
    placed = list(devices) or [Placed(device_name, served.model, slots)]
    checked_strategy(strategy, [device.name for device in devices])
    counted = itertools.count(1)  # one progress count over every device's buckets
    told = None if progress is None else (lambda done, size: progress(next(counted), size))

    def decoding(device: Placed) -> Backend:
        eager = EagerBackend(device.model, device.slots, context, device.name)
        if not graphs:
            return eager
        return GraphBackend(eager, told, graphs=eager.torch_device.startswith("cuda"), device_name=device.name)

    if strategy == "split":  # the prefill device runs prompts only: eagerly, one staging slot
        plan = split(EagerBackend(placed[0].model, 1, context, placed[0].name), decoding(placed[1]))
    elif strategy == "replicas":
        plan = replicas([decoding(device) for device in placed])
    else:
        plan = single(decoding(placed[0]))
    engine = Engine(plan, max_queue).start()
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
