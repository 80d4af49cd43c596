"""The step the server replays, as a place target: one batch bucket's graph-safe decode forward.

:class:`~kernelfleet.serve.graphs.GraphBackend` captures, per batch bucket ``b`` and context bucket,
:meth:`EagerBackend.forward <kernelfleet.serve.backend.EagerBackend.forward>` with ``rows=None``
over a :class:`~kernelfleet.serve.cache.SlotCache` of ``slots`` rows, reading one persistent
``(2, b)`` tensor of token ids and positions. :func:`decode_step` is that same call at the whole
context (``length=None``: plans are made for the whole context) as a place
:class:`~kernelfleet.workloads.steps.Step`, so ``analyze``, ``profile`` and ``plan`` see exactly
the kernels the placed server (``placed.py``) replays: its input is the bucket's tensor, its output
the logits, and its module names the weights and each layer's cache (``cache_L_keys``,
``cache_L_values``), so placement treats the cache as state.

A place command reaches it as ``hf:DIR,serve-decode,batch=B,context=C[,slots=S]``
(``workloads/targets.py`` names :func:`serve_decode` as a factory: the serve application imports the
targets, so they cannot import it back). The cache is allocated, as the graph backend does, by a
prefill into row 0 before the step is captured; every replay writes its pad rows' token 0 at
position 0 and the batch rows' tokens at their positions, and reads the rest: a replay from the same
inputs writes the same bytes, so kernelfleet's saved state puts back what it changed.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.graphs import Bucket, padded

CACHE_NAMES = ("cache_{layer}_keys", "cache_{layer}_values")  # as workloads/targets.py names a decode step's cache
WEIGHTS_PREFIX = "model."  # a weight's name in the step (the holder's ``model``), then its name in the model


def cache_buffers(backend: EagerBackend) -> dict[str, torch.Tensor]:
    """Each layer's cache tensors of ``backend`` by the names placement reads them under."""
    cache = backend.cache
    return {name.format(layer=layer): tensors[layer] for layer in sorted(cache.keys)
            for name, tensors in zip(CACHE_NAMES, (cache.keys, cache.values))}


def decode_step(backend: EagerBackend, bucket: int, name: str = "serve-decode", length: int | None = None) -> Any:
    """Bucket ``bucket``'s decode forward over ``backend``'s cache as a Step (module docstring),
    attending the first ``length`` positions (None: the whole context; the placed server captures
    shorter context buckets to carry its plans to, ``placed_build.py``)."""
    from kernelfleet.workloads.steps import Step

    if not backend.cache.keys:
        backend.prefill(0, [0])  # the cache is allocated outside any capture, as GraphBackend does
    inputs = torch.tensor(padded([], [], bucket, backend.context_tokens - 1), device=backend.torch_device)
    step = Bucket(bucket, inputs, length)
    holder = torch.nn.Module()  # names the weights and the cache: placement sees the cache as state
    holder.model = backend.model  # so each weight is named WEIGHTS_PREFIX + its name in the model
    for buffer, tensor in cache_buffers(backend).items():
        holder.register_buffer(buffer, tensor)

    def decode(_: torch.Tensor) -> torch.Tensor:
        return step.forward(backend)  # reads step.inputs, the tensor passed in

    return Step(decode, (inputs,), holder, f"{name}-b{bucket}" + (f"-c{length}" if length else ""))


def serve_decode(model: str, batch: int = 1, context: int = 128, slots: int | None = None, device: str = "cpu",
                 seed: int = 0) -> Any:
    """The factory ``hf:DIR,serve-decode`` names: the model of directory ``model`` (bf16 on a GPU, as
    ``kernelfleet serve`` loads it; float32 on the CPU) with a cache of ``slots`` (default ``batch``)
    rows of ``context`` tokens, and its bucket-``batch`` decode step."""
    from pathlib import Path

    from kernelfleet.workloads.targets import causal_lm

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    backend = EagerBackend(causal_lm(Path(model), device, seed, dtype), slots or batch, context)
    return decode_step(backend, batch, f"hf:{Path(model).name}-serve-decode")
