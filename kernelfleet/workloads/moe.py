"""An MoE LLM (gpt-oss / Mixtral-like): the dense skeleton with a top-k routed SwiGLU expert MLP.

Routing keeps every shape static, so prefill and decode stay CUDA-graph capturable:

1. The router scores all experts for every token; each token keeps its ``top_k`` experts, with
   gates = softmax over those k logits (equal to Mixtral's softmax-then-renormalise).
2. Capacity-based gather: each expert takes a fixed ``capacity`` C of token slots per step. Among
   the tokens that chose it, the earliest in the flattened batch win (GShard's priority);
   unused slots point at a token with gate 0. Expert inputs are one gather, [E, C, dim], and the
   experts run as batched matmuls against stacked weights [E, dim, ffn].
3. Combine by gathering each token's k expert outputs back (a zero row stands for a dropped slot)
   and summing them in a fixed order. A scatter-add (index_add_) would use atomics on a GPU and
   break bit-identical outputs between runs and placements.

FLOP overhead: the experts compute E·C rows where k·tokens are useful, i.e. about
``capacity_factor`` times the useful expert FLOPs (dropless, C = tokens: E/k times, 8x for
gpt-oss-20B). ``mlp_flops(executed=False)`` counts the useful k experts per token plus the router;
``executed=True`` counts E·C rows. Left out of gpt-oss: attention sinks, alternating sliding-window
layers, biases, its clamped SwiGLU variant and MXFP4 expert weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernelfleet.workloads.config import MoEConfig
from kernelfleet.workloads.llama import Transformer


class MoEMLP(nn.Module):
    """Top-k routed SwiGLU experts with a static capacity per expert."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = cfg.n_experts, cfg.top_k, cfg.capacity_factor
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(cfg.n_experts, cfg.dim, cfg.ffn_dim))
        self.w3 = nn.Parameter(torch.empty(cfg.n_experts, cfg.dim, cfg.ffn_dim))
        self.w2 = nn.Parameter(torch.empty(cfg.n_experts, cfg.ffn_dim, cfg.dim))

    def capacity(self, n_tokens: int) -> int:
        """Token slots per expert for a step of ``n_tokens`` tokens (a Python int: fixed per shape)."""
        if self.capacity_factor is None:
            return n_tokens
        return min(n_tokens, math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Experts chosen per token, [N, k] (best first), and their gates, [N, k], for ``x`` [N, dim]."""
        top_logits, top_idx = self.router(x).topk(self.top_k, dim=-1)
        return top_idx, F.softmax(top_logits.float(), dim=-1).to(x.dtype)

    def dispatch(self, top_idx: torch.Tensor) -> torch.Tensor:
        """Token index in each expert slot, [E, C]; slots past the demand hold tokens that did not pick it."""
        n = top_idx.shape[0]
        chosen = torch.zeros(n, self.n_experts, dtype=torch.long, device=top_idx.device)
        chosen.scatter_(1, top_idx, 1)
        # Priority n - i for token i if it chose the expert, else 0: topk keeps the earliest choosers.
        priority = chosen * torch.arange(n, 0, -1, device=top_idx.device)[:, None]
        return priority.t().topk(self.capacity(n), dim=-1).indices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n, e = x.shape[0], self.n_experts
        top_idx, gates = self.route(x)
        slots = self.dispatch(top_idx)  # [E, C]
        xs = x[slots]  # [E, C, dim]
        ys = torch.bmm(F.silu(torch.bmm(xs, self.w1)) * torch.bmm(xs, self.w3), self.w2)
        ys = torch.cat([ys, ys.new_zeros(e, 1, shape[-1])], dim=1)  # slot C: "dropped", zeros
        # slot_of[e, i]: where token i sits in expert e's slots, C if nowhere. Rows of `slots` hold
        # distinct tokens, so this scatter has no duplicate targets and is deterministic.
        c = slots.shape[1]
        slot_of = torch.full((e, n), c, dtype=torch.long, device=x.device)
        slot_of.scatter_(1, slots, torch.arange(c, device=x.device).expand(e, c).contiguous())
        # A slot filled by a token that did not choose the expert is never looked up below.
        token_slot = slot_of.gather(0, top_idx.t()).t()  # [N, k]
        picked = ys[top_idx, token_slot]  # [N, k, dim]
        return (gates[..., None] * picked).sum(dim=1).reshape(shape)


class MoETransformer(Transformer):
    """The MoE LLM: ``prefill``/``decode`` as in ``llama.Transformer``."""

    cfg: MoEConfig

    def make_mlp(self) -> nn.Module:
        return MoEMLP(self.cfg)

    def mlp_flops(self, tokens: int, executed: bool) -> int:
        c = self.cfg
        router = 2 * c.dim * c.n_experts * tokens
        rows = c.n_experts * self.layers[0].mlp.capacity(tokens) if executed else c.top_k * tokens
        return router + 2 * 3 * c.dim * c.ffn_dim * rows


def param_count(cfg: MoEConfig) -> int:
    """Parameters of ``MoETransformer(cfg)``, from the config alone."""
    attn = cfg.dim * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    experts = cfg.n_experts * 3 * cfg.dim * cfg.ffn_dim + cfg.dim * cfg.n_experts
    return cfg.n_layers * (attn + experts + 2 * cfg.dim) + 2 * cfg.vocab_size * cfg.dim + cfg.dim


def active_param_count(cfg: MoEConfig) -> int:
    """Parameters one token touches (top_k experts), the number MoE model cards quote as "active"."""
    return param_count(cfg) - cfg.n_layers * (cfg.n_experts - cfg.top_k) * 3 * cfg.dim * cfg.ffn_dim
