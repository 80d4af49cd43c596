"""What ``kernelfleet serve TARGET --cpu`` runs: load the model, start the loop, serve the API.

The CLI checks the options and prints; :func:`build` makes the engine and the app (the tests and
the benchmark start the same pair on a free port), :func:`serve` runs them on a bound socket until
interrupted (the CLI binds before it loads the model, so a port clash is one line at once).
"""

from __future__ import annotations

import socket
import threading

from fastapi import FastAPI

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet.listener import Listener
from kernelfleet.serve.api import serve_app
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.model import DEFAULT_CONTEXT_TOKENS, Served


def checked_sizes(slots: int, max_queue: int, context_tokens: int | None, max_context_tokens: int) -> int:
    """The tokens per slot (``context_tokens``, or the model's maximum up to a default), once the
    sizes make sense (UsageError naming the flag otherwise)."""
    if slots < 1 or max_queue < 0:
        raise UsageError(f"--slots must be at least 1 and --max-queue at least 0, got {slots} and {max_queue}")
    context = context_tokens or min(max_context_tokens, DEFAULT_CONTEXT_TOKENS)
    if not 1 < context <= max_context_tokens:
        raise UsageError(f"--context must be from 2 to the model's {max_context_tokens} tokens, got {context}")
    return context


def build(served: Served, slots: int, max_queue: int, context_tokens: int | None = None,
          token: str | None = None) -> tuple[Engine, FastAPI]:
    """A started engine over ``served`` on the CPU, eagerly, and its app."""
    context = checked_sizes(slots, max_queue, context_tokens, served.max_context_tokens)
    engine = Engine(EagerBackend(served.model, slots, context), max_queue).start()
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
