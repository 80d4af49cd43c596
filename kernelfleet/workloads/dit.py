"""A diffusion transformer (DiT, Peebles & Xie 2023) with adaLN-Zero blocks.

``denoise_step(latents[B, C, H, W], t[B])`` patchifies the latents, adds learned positions, runs the
blocks conditioned on the timestep embedding, and unpatchifies the prediction back to [B, C, H, W].
All shapes are fixed by the config, so one step is one CUDA graph; a sampler calls it per step.

adaLN-Zero: each block regresses shift/scale/gate for its attention and MLP branches from the
conditioning, with that regression zero-initialised, so every gate starts at 0 and the block starts
as the identity (as does the zero-initialised final layer's output, which starts at 0). That is
DiT's initialisation; ``adaln_zero_init=False`` draws those weights at random instead, for
benchmarks that want non-trivial values flowing through every kernel.

Left out of SD3.5-medium: the joint text stream (MMDiT), pooled text conditioning, QK-norm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernelfleet.workloads.config import DiTConfig
from kernelfleet.workloads.layers import SelfAttention, seeded_init_
from kernelfleet.workloads.multimodal import patchify


def timestep_features(t: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal features of (possibly fractional) timesteps t [B] → [B, dim], float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs
    return torch.cat([args.cos(), args.sin()], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(d, cfg.n_heads)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(d, cfg.mlp_ratio * d), nn.Linear(cfg.mlp_ratio * d, d)
        self.adaln = nn.Linear(d, 6 * d)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaln(F.silu(c)).chunk(6, dim=-1)
        x = x + gate1[:, None] * self.attn(modulate(self.norm1(x), shift1, scale1))
        h = self.fc2(F.gelu(self.fc1(modulate(self.norm2(x), shift2, scale2)), approximate="tanh"))
        return x + gate2[:, None] * h


class DiT(nn.Module):
    """Timestep-conditioned DiT over a fixed-size latent batch."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, p, ch = cfg.dim, cfg.patch_size, cfg.latent_channels
        self.patch_embed = nn.Linear(ch * p * p, d)
        self.pos_embed = nn.Parameter(torch.empty(1, cfg.n_tokens, d))
        self.t_fc1, self.t_fc2 = nn.Linear(cfg.freq_dim, d), nn.Linear(d, d)
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.final_adaln = nn.Linear(d, 2 * d)
        self.final = nn.Linear(d, p * p * ch)

    def reset_parameters(self, seed: int) -> None:
        """Seeded N(0, 0.02) weights, then (by default) adaLN-Zero: modulations and output at zero."""
        seeded_init_(self, seed)
        if self.cfg.adaln_zero_init:
            with torch.no_grad():
                for layer in [*(b.adaln for b in self.blocks), self.final_adaln, self.final]:
                    layer.weight.zero_()
                    layer.bias.zero_()

    def reset_state(self) -> None:
        """Nothing to reset: a DiT step carries no state between calls."""

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """[B, (H/p)·(W/p), C·p·p] → [B, C, H, W], the inverse of ``patchify``."""
        cfg = self.cfg
        b, g, p, c = x.shape[0], cfg.latent_size // cfg.patch_size, cfg.patch_size, cfg.latent_channels
        x = x.reshape(b, g, g, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, c, g * p, g * p)

    @torch.no_grad()
    def denoise_step(self, latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Model prediction (noise or velocity, per the sampler) for ``latents`` at timesteps ``t`` [B]."""
        cfg = self.cfg
        x = self.patch_embed(patchify(latents, cfg.patch_size).to(self.pos_embed.dtype)) + self.pos_embed
        c = self.t_fc2(F.silu(self.t_fc1(timestep_features(t, cfg.freq_dim).type_as(x))))
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.final_adaln(F.silu(c)).chunk(2, dim=-1)
        return self.unpatchify(self.final(modulate(self.final_norm(x), shift, scale)))

    def step_flops(self, batch: int | None = None) -> int:
        """Matmul and attention FLOPs of one ``denoise_step`` (bidirectional: tokens² pairs per image).

        Per token: patch embedding, 4·d² attention projections, 2·ratio·d² MLP, final projection;
        per image: attention pairs, the timestep MLP and each block's adaLN regression (d → 6d).
        """
        cfg = self.cfg
        b, n, d = batch or cfg.batch, cfg.n_tokens, cfg.dim
        patch_dim = cfg.latent_channels * cfg.patch_size**2
        per_token = 2 * (2 * patch_dim * d + cfg.n_layers * (4 * d * d + 2 * cfg.mlp_ratio * d * d))
        t_mlp_and_final_adaln = 2 * (cfg.freq_dim * d + d * d + 2 * d * d)
        per_image = cfg.n_layers * (4 * d * n * n + 2 * 6 * d * d) + t_mlp_and_final_adaln
        return b * (n * per_token + per_image)


def param_count(cfg: DiTConfig) -> int:
    """Parameters of ``DiT(cfg)``, from the config alone."""
    d, patch_dim, h = cfg.dim, cfg.latent_channels * cfg.patch_size**2, cfg.mlp_ratio * cfg.dim
    block = 4 * d * d + 4 * d + 2 * d * h + h + d + 6 * d * d + 6 * d
    embed = (patch_dim + 1) * d + cfg.n_tokens * d + (cfg.freq_dim + 1) * d + (d + 1) * d
    final = 2 * d * d + 2 * d + d * patch_dim + patch_dim
    return embed + cfg.n_layers * block + final
