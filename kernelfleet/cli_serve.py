"""``kernelfleet serve TARGET --cpu``: a model behind an OpenAI-compatible HTTP API.

It parses and prints only; the loop, the backend and the app are in ``serve/``. The listening
socket is bound before the model loads, so a port clash is one line at once; the listening rules
(loopback by default; another address needs ``--allow-remote`` and a token) are the agent's.
"""

from __future__ import annotations

import typer

from kernelfleet.cli_common import err
from kernelfleet.errors import UsageError


def serve(
    target: str = typer.Argument(..., help="hf:DIR, a transformers causal LM directory (weights from its "
                                 "safetensors; random from --seed where it has only config.json)."),
    cpu: bool = typer.Option(False, "--cpu", help="Run the model eagerly on the CPU (no graphs)."),
    listen: str = typer.Option("127.0.0.1:8000", "--listen", help="HOST:PORT of the API."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback listen address."),
    token: str | None = typer.Option(None, envvar="KERNELFLEET_TOKEN", help="Require this bearer token."),
    slots: int = typer.Option(4, "--slots", help="KV-cache slots: requests generating at once."),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests waiting for a slot at most (then 429)."),
    context: int | None = typer.Option(None, "--context", help="Tokens per slot, prompt and output (default: the "
                                       "model's maximum, at most 4096)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights of a directory with only config.json."),
) -> None:
    """Serve a model: POST /v1/completions (OpenAI's API, streaming too), /v1/models, /healthz, /metrics."""
    from kernelfleet.fleet.listener import bind, given_token, listen_address

    if not cpu:
        raise UsageError("serving on GPUs (captured graphs per batch bucket, placed weights) is not built yet: "
                         "pass --cpu to run the model eagerly on the CPU")
    token = given_token(token)
    host, port = listen_address(listen, allow_remote, token)
    from kernelfleet.serve.command import build, checked_sizes
    from kernelfleet.serve.command import serve as run
    from kernelfleet.serve.model import load, max_context_tokens

    # every flag is checked before the weights load: a mistake is one line at once
    checked_sizes(slots, max_queue, context, max_context_tokens(target))
    sock = bind(host, port)
    try:
        served = load(target, "cpu", seed)
        engine, app = build(served, slots, max_queue, context, token)
    except BaseException:
        sock.close()
        raise
    err.print(f"kernelfleet serve: {served.name} on http://{host}:{port}/v1 ({slots} slots of "
              f"{engine.context_tokens} tokens, the CPU)", markup=False, highlight=False)
    run(engine, app, sock)
