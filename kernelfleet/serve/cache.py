"""A KV cache of N request slots, each with its own positions.

transformers' ``StaticCache`` writes every row of a batch at the same position and advances one
internal counter per call; continuous batching needs each row at its own position, and rows that
are any subset of the slots. So the engine says, before each forward, which slots the batch rows
are (``rows``) and at which positions their new tokens go (``positions``); :meth:`SlotCache.update`
scatters the new keys and values there and hands attention the rows' cache up to the longest
row. :func:`attention_mask` masks, per row, every position past the row's own: what a slot's
previous request left there is never attended to.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class SlotCache(Cache):
    """Keys and values of ``slots`` requests of up to ``context_tokens`` tokens, per layer,
    allocated at the first forward (shapes and dtype from the model's own key states)."""

    def __init__(self, slots: int, context_tokens: int) -> None:
        super().__init__(layers=[])
        self.slots, self.context_tokens = slots, context_tokens
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.rows = torch.zeros(0, dtype=torch.long)
        self.positions = torch.zeros(0, 0, dtype=torch.long)
        self.length = 0

    def aim(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """The next forward's batch: row ``i`` is slot ``rows[i]``, its tokens at ``positions[i]``."""
        self.rows, self.positions = rows, positions
        self.length = int(positions.max()) + 1

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx not in self.keys:
            self.keys[layer_idx] = self._allocate(key_states)
            self.values[layer_idx] = self._allocate(value_states)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        # (batch, heads, tokens, dim) -> (batch, tokens, heads, dim): the index pair (row, position)
        # addresses one token of one slot
        where = (self.rows[:, None], slice(None), self.positions)
        keys[where] = key_states.transpose(1, 2)
        values[where] = value_states.transpose(1, 2)
        return keys[self.rows, :, :self.length], values[self.rows, :, :self.length]

    def _allocate(self, states: torch.Tensor) -> torch.Tensor:
        heads, dim = states.shape[1], states.shape[3]
        return torch.zeros(self.slots, heads, self.context_tokens, dim, dtype=states.dtype, device=states.device)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.context_tokens


def attention_mask(positions: torch.Tensor, length: int, eager: bool, dtype: torch.dtype) -> torch.Tensor:
    """(batch, 1, tokens, length): query ``i`` of row ``b`` sees cache position ``j`` iff
    ``j <= positions[b, i]``. Boolean for SDPA; additive (0 or the dtype's minimum) for eager attention."""
    seen = torch.arange(length, device=positions.device)[None, None, None, :] <= positions[:, None, :, None]
    if not eager:
        return seen
    return torch.zeros(seen.shape, dtype=dtype, device=positions.device).masked_fill(~seen, torch.finfo(dtype).min)
