"""A Llama-like dense decoder with a static KV cache (gpt-fast style).

Two steps, each with static shapes so it can be captured into a CUDA graph:

* ``prefill(tokens[B, S])`` fills cache positions 0..S-1 and returns the logits of the last
  position, [B, vocab] (all S rows of logits would be B·S·vocab, 17 GB at the h200 size).
* ``decode(token[B], position[B])`` writes one key/value per row at ``position`` with an indexed
  store and attends over the whole preallocated cache with a mask, so its shapes never change.

Left out of Llama-3.1: RoPE frequency scaling (matters only past 8k tokens), tied-embedding options,
sampling. Ragged prompts in one batch (different lengths) are not supported by ``prefill``.

FLOPs (``prefill_flops`` / ``decode_flops``) count matmuls and attention, the work that runs on the
tensor cores: ``2·(matmul params)·tokens + 4·heads·head_dim·(query, key) pairs`` per layer, plus the
LM head on one row per sequence. Norms, RoPE, softmax and SiLU (well under 1 %) are left out, as in
the PaLM MFU convention. MFU = FLOPs / seconds / peak, with the dense bf16 peak of the GPU taken from
``kernelfleet/catalog`` (where its datasheet is cited).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernelfleet.workloads.config import LlamaConfig
from kernelfleet.workloads.layers import RMSNorm, apply_rope, rope, seeded_init_


class Attention(nn.Module):
    """Grouped-query attention over a cache of shape [max_batch, kv_heads, max_seq_len, head_dim]."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        shape = (cfg.max_batch, cfg.n_kv_heads, cfg.max_seq_len, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                position: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.wq(x).view(b, t, self.n_heads, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rope(self.wk(x).view(b, t, self.n_kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if position is None:  # prefill from position 0: slice-assign, attend causally to the new keys
            self.k_cache[:b, :, :t] = k
            self.v_cache[:b, :, :t] = v
            keys, values = k, v
        else:  # decode: one indexed store per row (index_put_, no host sync), masked full-cache read
            rows = torch.arange(b, device=x.device)
            self.k_cache[rows, :, position] = k[:, :, 0]
            self.v_cache[rows, :, position] = v[:, :, 0]
            keys, values = self.k_cache[:b], self.v_cache[:b]
        group = self.n_heads // self.n_kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=position is None)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, mlp: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.dim, cfg.norm_eps), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.dim, cfg.norm_eps), mlp

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                position: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, position, mask)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """The dense LLM. Subclasses swap the MLP (``make_mlp``) and its FLOPs (``mlp_flops``)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, self.make_mlp()) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def make_mlp(self) -> nn.Module:
        return SwiGLU(self.cfg.dim, self.cfg.ffn_dim)

    def reset_parameters(self, seed: int) -> None:
        """Seeded N(0, 0.02) weights, unit norms."""
        seeded_init_(self, seed)

    def reset_state(self) -> None:
        """Zero the KV cache in place (its storage, and so any captured graph, stays valid)."""
        for layer in self.layers:
            layer.attn.k_cache.zero_()
            layer.attn.v_cache.zero_()

    def _run(self, h: torch.Tensor, positions: torch.Tensor, position: torch.Tensor | None,
             mask: torch.Tensor | None) -> torch.Tensor:
        cos, sin = rope(positions, self.cfg.head_dim, self.cfg.rope_theta)
        for layer in self.layers:
            h = layer(h, cos, sin, position, mask)
        return self.head(self.norm(h[:, -1]))

    @torch.no_grad()
    def prefill_embeds(self, h: torch.Tensor) -> torch.Tensor:
        """Prefill from input embeddings [B, S, dim] (the multimodal model prepends image tokens)."""
        b, s, _ = h.shape
        positions = torch.arange(s, device=h.device).expand(b, s)
        return self._run(h, positions, None, None)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Fill the cache with ``tokens`` [B, S] at positions 0..S-1; logits of position S-1, [B, vocab]."""
        return self.prefill_embeds(self.embed(tokens))

    @torch.no_grad()
    def decode(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One token per row, ``token`` [B] at ``position`` [B] (a tensor, so graphs can replay it)."""
        keys = torch.arange(self.cfg.max_seq_len, device=token.device)
        mask = (keys[None, :] <= position[:, None])[:, None, None, :]  # [B, 1, 1, max_seq_len]
        return self._run(self.embed(token[:, None]), position[:, None], position, mask)

    # --- FLOPs -----------------------------------------------------------------------------------
    def mlp_flops(self, tokens: int, executed: bool) -> int:
        return 2 * 3 * self.cfg.dim * self.cfg.ffn_dim * tokens

    def _flops(self, batch: int, new_tokens: int, pairs: int, executed: bool) -> int:
        c = self.cfg
        tokens = batch * new_tokens
        proj = 2 * tokens * c.dim * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)  # q, o + k, v
        attn = 4 * c.n_heads * c.head_dim * pairs  # Q·Kᵀ and P·V, 2 FLOPs per multiply-add each
        head = 2 * batch * c.dim * c.vocab_size  # logits for the last row only
        return c.n_layers * (proj + attn + self.mlp_flops(tokens, executed)) + head

    def prefill_flops(self, batch: int, seq_len: int, executed: bool = False) -> int:
        """Useful FLOPs of ``prefill`` (causal: S·(S+1)/2 pairs per sequence).

        ``executed=True`` counts what the code issues instead: S² pairs (the math/efficient SDPA
        kernels compute the masked half; flash kernels skip most of it) and, for MoE, capacity
        padding. It is what ``FlopCounterMode`` reports.
        """
        pairs = batch * (seq_len * seq_len if executed else seq_len * (seq_len + 1) // 2)
        return self._flops(batch, seq_len, pairs, executed)

    def decode_flops(self, batch: int, context: int, executed: bool = False) -> int:
        """Useful FLOPs of ``decode`` with ``context`` cached positions attended (position + 1).

        ``executed=True`` counts the masked read of the whole ``max_seq_len`` cache.
        """
        pairs = batch * (self.cfg.max_seq_len if executed else context)
        return self._flops(batch, 1, pairs, executed)


def param_count(cfg: LlamaConfig) -> int:
    """Parameters of ``Transformer(cfg)``, from the config alone (untied embedding and head)."""
    attn = cfg.dim * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    per_layer = attn + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim
    return cfg.n_layers * per_layer + 2 * cfg.vocab_size * cfg.dim + cfg.dim
