"""What ``kernelfleet serve TARGET`` runs: load the model, start the loop, serve the API.

The CLI checks the options and prints; :func:`build` makes the engine and the app (the tests and
the benchmark start the same pair on a free port), :func:`serve` runs them on a bound socket until
interrupted (the CLI binds before it loads the model, so a port clash is one line at once).
On a GPU the backend is the graph backend (``graphs.py``); on the CPU the eager one, or, with
``graphs=True``, the graph backend's CPU twin (the same buckets and padding, nothing captured).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import torch
from fastapi import FastAPI

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet.listener import Listener
from kernelfleet.serve.api import serve_app
from kernelfleet.serve.backend import Backend, EagerBackend
from kernelfleet.serve.device import Gpu, gpu_for
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.graphs import GraphBackend
from kernelfleet.serve.memory import parse_device, planned_slots
from kernelfleet.serve.model import DEFAULT_CONTEXT_TOKENS, Served, footprint


def checked_sizes(slots: int | None, max_queue: int, context_tokens: int | None, max_context_tokens: int) -> int:
    """The tokens per slot (``context_tokens``, or the model's maximum up to a default), once the
    sizes make sense (UsageError naming the flag otherwise); ``slots`` None: sized later, from memory."""
    if (slots is not None and slots < 1) or max_queue < 0:
        raise UsageError(f"--slots must be at least 1 and --max-queue at least 0, got {slots} and {max_queue}")
    context = context_tokens or min(max_context_tokens, DEFAULT_CONTEXT_TOKENS)
    if not 1 < context <= max_context_tokens:
        raise UsageError(f"--context must be from 2 to the model's {max_context_tokens} tokens, got {context}")
    return context


def fitted(target: str, device: str | None, slots: int | None, dtype: torch.dtype,
           context_tokens: int) -> tuple[int, Gpu]:
    """The GPU of ``--device`` (GPU 0 without one) and the slots (``slots``, or as many as fit),
    once the model fits its cap: checked from the config, before any weight loads (memory.py)."""
    gpu = gpu_for(parse_device(device) if device is not None else None)
    return planned_slots(footprint(target, dtype, context_tokens), gpu.cap_bytes, slots, gpu.where), gpu


def build(served: Served, slots: int, max_queue: int, context_tokens: int | None = None,
          token: str | None = None, graphs: bool = False, progress: Callable[[int, int], None] | None = None,
          device_name: str | None = None) -> tuple[Engine, FastAPI]:
    """A started engine over ``served`` and its app: eagerly, or with ``graphs`` through the graph
    backend (captured where the model is on a GPU; ``progress(done, bucket)`` after each bucket)."""
    context = checked_sizes(slots, max_queue, context_tokens, served.max_context_tokens)
    eager = EagerBackend(served.model, slots, context)
    backend: Backend = eager
    if graphs:
        backend = GraphBackend(eager, progress, graphs=eager.device.startswith("cuda"), device_name=device_name)
    engine = Engine(backend, max_queue).start()
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
