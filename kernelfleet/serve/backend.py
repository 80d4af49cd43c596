"""Device backends: what runs one forward of the generation loop on a device.

The engine (``engine.py``) decides what runs; a backend runs it. Two calls:

* ``prefill(slot, token_ids, start)``: a prompt, or a chunk of one, into one slot's cache at
  positions ``start .. start + len(token_ids) - 1``, attending to the slot's positions before
  ``start`` (the chunks before it); the logits of its last position (the first token's, after a
  prompt's last chunk). The engine's ``--prefill-chunk`` cuts prompts so (``engine.py``);
* ``decode(slots, token_ids, positions)``: one token for each of several slots, at each slot's own
  position, their logits (one row per slot).

A backend may also offer ``prefill_many(slots, prompts)``: several whole prompts into their slots
in one forward, the logits of each one's last position (one row per slot). The prompts are
right-aligned (:func:`right_aligned`): each row's pads come first and write only the context's last
position of its own slot, which no request attends to before writing it, so every prompt sees only
its own tokens and one forward's launches serve them all (``--prefill-batch``, ``engine.py``).

:class:`EagerBackend` runs a transformers causal LM eagerly (the CPU mode, and any device without
graphs). :class:`~kernelfleet.serve.graphs.GraphBackend` implements the same two calls over it on a
GPU: at start it captures a decode graph per batch bucket (1, 2, 4, ... up to the slots) of
:meth:`EagerBackend.forward` in its graph-safe form, and ``decode`` pads the batch to the smallest
bucket that holds it, writes the inputs in place and replays that graph. The place half's plans
would run each bucket's graph across devices; the engine does not change.

Two more calls let a request move between backends (the prefill/decode split, ``strategies.py``):
``kv(slot)`` says where a slot's keys and values lie (a cache and its row), and
``adopt(slot, cache, row, tokens)`` copies such a row into one of this backend's slots.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch

from kernelfleet.serve.cache import SlotCache, attention_mask


class Backend(Protocol):
    """What the engine needs of a device (module docstring); ``device`` is its name in the metrics."""

    device: str
    slots: int
    context_tokens: int

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor: ...

    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor: ...

    def kv(self, slot: int) -> tuple[SlotCache, int]: ...

    def adopt(self, slot: int, source: SlotCache, row: int, tokens: int) -> None: ...


def right_aligned(prompts: list[list[int]], pad_position: int) -> tuple[list[list[int]], list[list[int]], int]:
    """Whole prompts of different lengths as one batch: ids and positions, each row's pads (token 0 at
    ``pad_position``, the context's last) before its prompt, so every row's last position is its
    prompt's last token; and the longest prompt, the positions attention reads. No request attends to
    ``pad_position`` before it writes it (the API keeps a prompt and its output within the context, and
    the last token is never fed back; ``graphs.padded``), and each pad writes only its own row."""
    longest = max(map(len, prompts))
    ids = [[0] * (longest - len(p)) + p for p in prompts]
    positions = [[pad_position] * (longest - len(p)) + list(range(len(p))) for p in prompts]
    return ids, positions, longest


def call_arguments(model: torch.nn.Module) -> tuple[str, str]:
    """The names ``model.forward`` gives its cache and its logits-to-keep arguments: transformers 5
    calls the cache ``cache``, earlier releases ``past_key_values``."""
    accepted = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in accepted else "past_key_values",
            "logits_to_keep" if "logits_to_keep" in accepted else "num_logits_to_keep")


class EagerBackend:
    """A transformers causal LM run eagerly, its KV cache a :class:`SlotCache` of ``slots`` slots
    (``held``: the layers' caches it keeps, as SlotCache takes it; ``cache``: another backend's to
    share, in its place); ``device_name`` names it in the metrics (default: torch's name of its device)."""

    def __init__(self, model: torch.nn.Module, slots: int, context_tokens: int, device_name: str | None = None,
                 held: set[tuple[int, str]] | None = None, cache: SlotCache | None = None) -> None:
        self.model, self.slots, self.context_tokens = model, slots, context_tokens
        parameter = next(model.parameters())
        self.torch_device, self.dtype = str(parameter.device), parameter.dtype
        self.device = device_name or self.torch_device
        self.cache = cache if cache is not None else SlotCache(slots, context_tokens, self.torch_device, held)
        self.eager = model.config._attn_implementation == "eager"
        self.cache_argument, self.keep_argument = call_arguments(model)

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        positions = torch.arange(start, start + len(token_ids), device=self.torch_device)[None, :]
        return self.forward(torch.tensor([token_ids], device=self.torch_device), torch.tensor([slot], device=self.torch_device),
                            positions, start + len(token_ids))[0]

    def prefill_many(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Whole ``prompts`` into ``slots`` (cache rows) in one forward (module docstring); one row of logits each."""
        ids, positions, longest = right_aligned(prompts, self.context_tokens - 1)
        return self.forward(torch.tensor(ids, device=self.torch_device), torch.tensor(slots, device=self.torch_device),
                            torch.tensor(positions, device=self.torch_device), longest)

    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor:
        return self.forward(torch.tensor(token_ids, device=self.torch_device)[:, None], torch.tensor(slots, device=self.torch_device),
                            torch.tensor(positions, device=self.torch_device)[:, None], max(positions) + 1)

    def kv(self, slot: int) -> tuple[SlotCache, int]:
        """Where ``slot``'s keys and values lie: the cache and its row."""
        return self.cache, slot

    @torch.inference_mode()
    def adopt(self, slot: int, source: SlotCache, row: int, tokens: int) -> None:
        """Take over a request prefilled elsewhere: ``source``'s row ``row`` into ``slot`` (cache.py)."""
        self.cache.adopt(source, row, slot, tokens)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                length: int | None) -> torch.Tensor:
        """Logits of the last token of each row: ``ids`` (batch, tokens) into cache rows ``rows`` at
        ``positions`` (batch, tokens). ``length=None`` is the graph-safe forward (cache.py): no host
        read, no shape that depends on the inputs' values, so the graph backend captures this call."""
        self.cache.aim(rows, positions, length)
        mask = attention_mask(positions, self.cache.length, self.eager, self.dtype)
        # position_ids and a ready 4-D mask are passed in: without them transformers derives both
        # from the cache's length on the host (a sync a graph cannot capture, and one position for all rows)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         **{self.cache_argument: self.cache, self.keep_argument: 1})
        return out.logits[:, -1].float()
