"""Pieces shared by the workloads: norms, RoPE, bidirectional attention, seeded construction."""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

M = TypeVar("M", bound=nn.Module)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32: bf16 sums of squares lose too much precision over 4096 channels.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).type_as(x)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape ``positions.shape + (1, head_dim // 2)``, float32.

    Computed from the position tensor on every step rather than looked up in a table: it keeps the
    decode step free of Python ints (CUDA-graph capturable) and costs a few elementwise kernels.
    """
    even = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = theta ** -(even / head_dim)
    angles = positions.float()[..., None] * inv_freq
    return angles.cos()[..., None, :], angles.sin()[..., None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the Hugging Face Llama layout) on ``x`` of shape [B, T, heads, head_dim]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention without a cache (ViT and DiT tokens see each other)."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


def seeded_init_(model: nn.Module, seed: int, std: float = 0.02) -> torch.Generator:
    """Fill every parameter from one generator seeded with ``seed``, in registration order.

    Matrices (and conv kernels) get N(0, std); 1-D norm weights get ones, other 1-D
    parameters (biases) zeros. Returns the generator so a family can draw its special
    parameters (Mamba's Δ bias) from the same stream.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std, generator=gen)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()
    return gen


def build(cls: type[M], cfg: object, seed: int = 0, device: str | torch.device = "cpu",
          dtype: torch.dtype | None = None) -> M:
    """Construct ``cls(cfg)`` on ``device`` with seeded random weights, in eval mode.

    The module is first built on the meta device so an 8 B-parameter model is never initialised
    twice (nor on the CPU); ``dtype`` overrides the config's (tests use float32).
    """
    from kernelfleet.workloads.config import torch_dtype

    with torch.device("meta"):
        model = cls(cfg)
    # Casting on meta is free; caches and states take the model dtype, as in mamba_ssm and gpt-fast.
    model = model.to(dtype or torch_dtype(cfg.dtype)).to_empty(device=device)  # type: ignore[attr-defined]
    model.reset_parameters(seed)  # type: ignore[operator]
    model.reset_state()  # type: ignore[operator]
    return model.eval().requires_grad_(False)
