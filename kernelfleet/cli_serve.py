"""``kernelfleet serve TARGET``: a model behind an OpenAI-compatible HTTP API.

It parses and prints only; the loop, the backends and the app are in ``serve/``. On a GPU (the
default) decode runs as captured graphs, one per batch bucket, with a progress bar while they are
captured; ``--cpu`` runs the model eagerly on the CPU. Every flag, and whether the model fits the
device's cap, is checked before the weights load, and the listening socket is bound before them
too, so a mistake or a port clash is one line at once; the listening rules (loopback by default;
another address needs ``--allow-remote`` and a token) are the agent's.
"""

from __future__ import annotations

import time

import typer

from kernelfleet.cli_common import err
from kernelfleet.errors import UsageError

DTYPES = ("bfloat16", "float16", "float32")
CPU_SLOTS = 4  # the CPU's default: tiny models, a few requests at once


def serve(
    target: str = typer.Argument(..., help="hf:DIR, a transformers causal LM directory (weights from its "
                                 "safetensors; random from --seed where it has only config.json)."),
    cpu: bool = typer.Option(False, "--cpu", help="Run the model eagerly on the CPU (no graphs)."),
    device: str | None = typer.Option(None, "--device", help="NAME:MEMORY_GB[@GPU]: the GPU (default 0), its name "
                                      "in the metrics, and the memory the weights and the KV cache must fit."),
    listen: str = typer.Option("127.0.0.1:8000", "--listen", help="HOST:PORT of the API."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback listen address."),
    token: str | None = typer.Option(None, envvar="KERNELFLEET_TOKEN", help="Require this bearer token."),
    slots: int | None = typer.Option(None, "--slots", help="KV-cache slots: requests generating at once (default: "
                                     f"on a GPU as many as fit, at most 64; on the CPU {CPU_SLOTS})."),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests waiting for a slot at most (then 429)."),
    context: int | None = typer.Option(None, "--context", help="Tokens per slot, prompt and output (default: the "
                                       "model's maximum, at most 4096)."),
    dtype: str | None = typer.Option(None, "--dtype", help=f"{'|'.join(DTYPES)} (default: bfloat16 on a GPU, "
                                     "float32 on the CPU)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights of a directory with only config.json."),
) -> None:
    """Serve a model: POST /v1/completions (OpenAI's API, streaming too), /v1/models, /healthz, /metrics."""
    from kernelfleet.fleet.listener import bind, given_token, listen_address

    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype takes {', '.join(DTYPES)}, got {dtype!r}")
    if cpu and device is not None:
        raise UsageError("--device names a GPU; with --cpu the model runs on the CPU: pass one or the other")
    token = given_token(token)
    host, port = listen_address(listen, allow_remote, token)
    import torch

    from kernelfleet.serve.command import checked_sizes, fitted
    from kernelfleet.serve.command import serve as run
    from kernelfleet.serve.model import load, max_context_tokens

    chosen = getattr(torch, dtype or ("float32" if cpu else "bfloat16"))
    # every flag is checked before the weights load: a mistake is one line at once
    tokens_per_slot = checked_sizes(slots, max_queue, context, max_context_tokens(target))
    if cpu:
        slots = slots or CPU_SLOTS
        where, name = "the CPU", None
    else:
        slots, gpu = fitted(target, device, slots, chosen, tokens_per_slot)
        where, name = gpu.described, gpu.name
    sock = bind(host, port)
    try:
        if not cpu:
            gpu.enforce()
        served = load(target, "cpu" if cpu else gpu.torch_device, seed, chosen)
        started = time.perf_counter()
        engine, app = _built(served, slots, max_queue, tokens_per_slot, token, not cpu, name)
    except BaseException:
        sock.close()
        raise
    if not cpu:
        sizes = ", ".join(map(str, engine.backend.sizes))
        err.print(f"kernelfleet serve: decode graphs of batch buckets {sizes} captured in "
                  f"{time.perf_counter() - started:.1f} s", markup=False, highlight=False)
    err.print(f"kernelfleet serve: {served.name} on http://{host}:{port}/v1 ({slots} slots of "
              f"{engine.context_tokens} tokens, {where})", markup=False, highlight=False)
    run(engine, app, sock)


def _built(served, slots: int, max_queue: int, context: int, token: str | None, graphs: bool, name: str | None):
    """The engine and app (``serve.command.build``), with a progress bar over the buckets while a
    GPU's graphs are captured."""
    from kernelfleet.serve.command import build

    if not graphs:
        return build(served, slots, max_queue, context, token)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernelfleet.serve.graphs import buckets

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("capturing decode graphs", total=len(buckets(slots)))
        return build(served, slots, max_queue, context, token, graphs=True, device_name=name,
                     progress=lambda done, size: bar.update(task, completed=done,
                                                            description=f"captured the graph of batch bucket {size}"))
