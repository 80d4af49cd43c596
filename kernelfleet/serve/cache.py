"""A KV cache of N request slots, each with its own positions.

transformers' ``StaticCache`` writes every row of a batch at the same position and advances one
internal counter per call; continuous batching needs each row at its own position, and rows that
are any subset of the slots. So the backend says, before each forward, which slots the batch rows
are (``rows``) and at which positions their new tokens go (``positions``); :meth:`SlotCache.update`
scatters the new keys and values there and hands attention the rows' cache up to ``length``.
:func:`attention_mask` masks, per row, every position past the row's own: what a slot's previous
request left there is never attended to.

Two ways to aim a forward, the same writes and the same attended values:

* eager (``rows`` a tensor, ``length`` given): the batch is any rows; attention reads them
  (gathered) up to the longest row's position, the least work, but the shapes change with the batch;
* graph-safe (``rows=None``, ``length`` fixed per graph): the batch is the cache's first rows, in
  order, and attention reads them as they lie (a view) up to ``length``, masked; ``positions`` is
  the caller's persistent tensor, written in place between replays. Nothing in :meth:`update` reads
  a tensor on the host, and no shape depends on what the tensors hold, so a CUDA graph captures the
  forward once per (batch size, length) and replays it for any positions below the length. The
  graph backend keeps the running requests in the first rows (``rows.py``), moving one with
  :meth:`SlotCache.exchange` when needed.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class SlotCache(Cache):
    """Keys and values of ``slots`` requests of up to ``context_tokens`` tokens, per layer,
    allocated at the first forward (shapes and dtype from the model's own key states). ``held``: the
    (layer, ``"keys"`` or ``"values"``) caches kept here (None: all); the others are views of one
    zeroed tensor per shape, for a device that runs the forward's kernels over them but keeps no
    request in them (a device other than home under ``serve --plans``, whose plans keep the cache
    home)."""

    def __init__(self, slots: int, context_tokens: int, device: str = "cpu",
                 held: set[tuple[int, str]] | None = None) -> None:
        super().__init__(layers=[])
        self.slots, self.context_tokens, self.device, self.held = slots, context_tokens, device, held
        self._scratch: dict[tuple, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.rows: torch.Tensor | None = None
        self.written: torch.Tensor | None = None  # (batch, 1): the row each batch row writes
        self.positions = torch.zeros(0, 0, dtype=torch.long)
        self.length = context_tokens

    def aim(self, rows: torch.Tensor | None, positions: torch.Tensor, length: int | None = None) -> None:
        """The next forward's batch: row ``i`` is slot ``rows[i]`` (None: slot ``i``), its tokens at
        ``positions[i]``; attention reads each row's first ``length`` positions (None: the whole context)."""
        self.rows, self.positions = rows, positions
        first = torch.arange(positions.shape[0], device=positions.device)  # a shape, not data: graph-safe
        self.written = (first if rows is None else rows)[:, None]
        self.length = self.context_tokens if length is None else length

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx not in self.keys:
            self.keys[layer_idx] = self._layer(key_states, layer_idx, "keys")
            self.values[layer_idx] = self._layer(value_states, layer_idx, "values")
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        # (batch, heads, tokens, dim) -> (batch, tokens, heads, dim): the index pair (row, position)
        # addresses one token of one slot
        where = (self.written, slice(None), self.positions)
        keys[where] = key_states.transpose(1, 2)
        values[where] = value_states.transpose(1, 2)
        # the first rows are a view; other rows are gathered (eager only: their shapes vary anyway)
        batch = slice(0, key_states.shape[0]) if self.rows is None else self.rows
        return keys[batch, :, :self.length], values[batch, :, :self.length]

    def exchange(self, source: int, target: int, tokens: int) -> None:
        """Swap rows ``source`` and ``target``'s first ``tokens`` positions, every layer: a running
        request moving into a free row (what comes back is garbage, in a row no request holds), or
        into the row of a request still being prefilled, which takes the running one's row (rows.py)."""
        rows = torch.tensor([[source, target], [target, source]], device=self.device)
        for kind, cache in (("keys", self.keys), ("values", self.values)):
            for index, layer in cache.items():
                if self.holds(index, kind):
                    layer[rows[0], :, :tokens] = layer[rows[1], :, :tokens]  # the right side is a gathered copy

    def adopt(self, source: SlotCache, source_row: int, target_row: int, tokens: int) -> None:
        """Copy ``source``'s row ``source_row`` (its first ``tokens`` positions, every layer) into row
        ``target_row``: a request prefilled on another device, handed over to decode here. Between two
        GPUs each layer is one device-to-device copy, queued without a host wait (``non_blocking``;
        torch orders it after the source's prefill and before this device's next forward); on the
        CPU a plain copy. A cache that has not run a forward yet is allocated from the source's shapes."""
        for mine, theirs in ((self.keys, source.keys), (self.values, source.values)):
            for layer, tensor in theirs.items():
                if layer not in mine:
                    mine[layer] = self._allocate(tensor, self.device)
                mine[layer][target_row, :, :tokens].copy_(tensor[source_row, :, :tokens], non_blocking=True)

    def holds(self, layer: int, kind: str) -> bool:
        return self.held is None or (layer, kind) in self.held

    def _layer(self, states: torch.Tensor, layer: int, kind: str) -> torch.Tensor:
        if self.holds(layer, kind):
            return self._allocate(states)
        shape = (states.shape[1], states.shape[3], states.dtype)
        if shape not in self._scratch:
            self._scratch[shape] = self._allocate(states)
        return self._scratch[shape]

    def _allocate(self, states: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
        heads, dim = states.shape[1], states.shape[3]
        return torch.zeros(self.slots, heads, self.context_tokens, dim, dtype=states.dtype,
                           device=states.device if device is None else device)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.context_tokens


def attention_mask(positions: torch.Tensor, length: int, eager: bool, dtype: torch.dtype) -> torch.Tensor:
    """(batch, 1, tokens, length): query ``i`` of row ``b`` sees cache position ``j`` iff
    ``j <= positions[b, i]``. Boolean for SDPA; additive (0 or the dtype's minimum) for eager attention.
    Device ops only (no host read): graph-safe."""
    seen = torch.arange(length, device=positions.device)[None, None, None, :] <= positions[:, None, :, None]
    if not eager:
        return seen
    return torch.zeros(seen.shape, dtype=dtype, device=positions.device).masked_fill(~seen, torch.finfo(dtype).min)
