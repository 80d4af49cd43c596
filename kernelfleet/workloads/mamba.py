"""A Mamba-like SSM language model: Mamba-1 selective-scan blocks, recurrent state for decode.

Per block (Gu & Dao 2023, Algorithm 2): in-projection to x and a gate z (each d_inner wide), a
depthwise causal conv of width d_conv on x, SiLU, then input-dependent Δ (through a rank-R
projection), B and C; the selective scan

    h_t = exp(Δ_t·A) ⊙ h_{t-1} + Δ_t·B_t·x_t,      y_t = C_t·h_t + D ⊙ x_t,

gated by SiLU(z) and projected back. ``prefill`` runs the scan sequentially in torch (exact, slow:
one small kernel group per position); ``decode`` advances the conv window and h by one step,
updating both in place so the step is CUDA-graph capturable. ``position`` is accepted by ``decode``
for the common interface and not used (an SSM has no positions).

Left out of Mamba-Codestral-7B: its Mamba-2 (SSD) block with multi-head scalar-A state and chunked
parallel scan, grouped norm before the out-projection. FLOPs count the matmuls and the depthwise
conv; the scan's elementwise work (~9·d_inner·d_state per token per layer, 0.6 % at the h200 size)
is left out, as FlopCounterMode also leaves it out.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernelfleet.workloads.config import MambaConfig
from kernelfleet.workloads.layers import RMSNorm, seeded_init_


class MambaBlock(nn.Module):
    def __init__(self, cfg: MambaConfig) -> None:
        super().__init__()
        di, n, r = cfg.d_inner, cfg.d_state, cfg.dt_rank
        self.d_state, self.dt_rank = n, r
        self.in_proj = nn.Linear(cfg.dim, 2 * di, bias=False)
        self.conv = nn.Conv1d(di, di, cfg.d_conv, groups=di)  # depthwise; causal padding done by hand
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di)
        self.A_log = nn.Parameter(torch.empty(di, n))
        self.D = nn.Parameter(torch.empty(di))
        self.out_proj = nn.Linear(di, cfg.dim, bias=False)
        self.register_buffer("conv_state", torch.zeros(cfg.max_batch, di, cfg.d_conv - 1), persistent=False)
        self.register_buffer("ssm_state", torch.zeros(cfg.max_batch, di, n), persistent=False)

    def _ssm_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Δ [.., di], B [.., n], C [.., n] from the conv output x [.., di], all float32."""
        dt, b, c = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return F.softplus(self.dt_proj(dt)).float(), b.float(), c.float()

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """Prefill over u [B, L, dim] from a zero state; leaves the final conv window and h behind."""
        bsz, length, _ = u.shape
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x = x.transpose(1, 2)  # [B, di, L]
        k = self.conv.kernel_size[0]
        window = F.pad(x, (k - 1, 0))  # left zero padding = causal conv from an empty state
        self.conv_state[:bsz].copy_(window[:, :, -(k - 1):])
        x = F.silu(self.conv(window)).transpose(1, 2)  # [B, L, di]
        dt, b, c = self._ssm_inputs(x)
        a = -torch.exp(self.A_log.float())  # [di, n]; negative so the state decays
        h = torch.zeros(bsz, x.shape[-1], self.d_state, device=u.device)
        ys = []
        for t in range(length):  # sequential, exact; a chunked scan kernel is the fast path
            h = torch.exp(dt[:, t, :, None] * a) * h + (dt[:, t] * x[:, t].float())[..., None] * b[:, t, None]
            ys.append((h * c[:, t, None]).sum(-1))
        self.ssm_state[:bsz].copy_(h)
        y = torch.stack(ys, dim=1) + x.float() * self.D.float()
        return self.out_proj((y * F.silu(z.float())).type_as(u))

    def step(self, u: torch.Tensor) -> torch.Tensor:
        """Decode one position, u [B, dim], from the stored state; updates it in place."""
        bsz = u.shape[0]
        x, z = self.in_proj(u).chunk(2, dim=-1)
        window = torch.cat([self.conv_state[:bsz], x[:, :, None]], dim=-1)  # [B, di, d_conv]
        self.conv_state[:bsz].copy_(window[:, :, 1:])
        x = F.silu((window * self.conv.weight[:, 0]).sum(-1) + self.conv.bias)
        dt, b, c = self._ssm_inputs(x)
        a = -torch.exp(self.A_log.float())
        h = self.ssm_state[:bsz].float()
        h = torch.exp(dt[..., None] * a) * h + (dt * x.float())[..., None] * b[:, None]
        self.ssm_state[:bsz].copy_(h)
        y = (h * c[:, None]).sum(-1) + x.float() * self.D.float()
        return self.out_proj((y * F.silu(z.float())).type_as(u))


class Residual(nn.Module):
    def __init__(self, cfg: MambaConfig) -> None:
        super().__init__()
        self.norm, self.mixer = RMSNorm(cfg.dim, cfg.norm_eps), MambaBlock(cfg)


class Mamba(nn.Module):
    """The SSM LLM, with the same ``prefill`` / ``decode`` interface as ``llama.Transformer``."""

    def __init__(self, cfg: MambaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Residual(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def reset_parameters(self, seed: int) -> None:
        """Seeded weights; A, D and the Δ bias get the Mamba initialisation (drawn from the same seed)."""
        gen = seeded_init_(self, seed)
        di, n = self.cfg.d_inner, self.cfg.d_state
        with torch.no_grad():
            for layer in self.layers:
                m = layer.mixer
                # A = -(1..n) per channel (S4D-real), D = 1, Δ log-uniform in [1e-3, 0.1] through softplus.
                m.A_log.copy_(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).expand(di, n))
                m.D.fill_(1.0)
                u = torch.rand(di, generator=gen, device=gen.device)
                dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
                m.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def reset_state(self) -> None:
        """Zero the conv windows and SSM states in place."""
        for layer in self.layers:
            layer.mixer.conv_state.zero_()
            layer.mixer.ssm_state.zero_()

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run ``tokens`` [B, L] from a zero state; logits of the last position, [B, vocab]."""
        h = self.embed(tokens)
        for layer in self.layers:
            h = h + layer.mixer(layer.norm(h))
        return self.head(self.norm(h[:, -1]))

    @torch.no_grad()
    def decode(self, token: torch.Tensor, position: torch.Tensor | None = None) -> torch.Tensor:
        """Advance every row by ``token`` [B]; logits [B, vocab]. ``position`` is ignored."""
        h = self.embed(token)
        for layer in self.layers:
            h = h + layer.mixer.step(layer.norm(h))
        return self.head(self.norm(h))

    def _flops(self, batch: int, tokens: int, conv_outputs: int) -> int:
        c = self.cfg
        di, r, n = c.d_inner, c.dt_rank, c.d_state
        per_token = 2 * (c.dim * 2 * di + di * (r + 2 * n) + r * di + di * c.dim)
        conv = 2 * di * c.d_conv * conv_outputs  # depthwise: one kernel row per channel
        return c.n_layers * (per_token * tokens + conv) + 2 * batch * c.dim * c.vocab_size

    def prefill_flops(self, batch: int, seq_len: int, executed: bool = False) -> int:
        """FLOPs of ``prefill`` (no attention: linear in ``seq_len``); ``executed`` changes nothing."""
        return self._flops(batch, batch * seq_len, batch * seq_len)

    def decode_flops(self, batch: int, context: int = 0, executed: bool = False) -> int:
        """FLOPs of ``decode``, independent of context: the state has a fixed size."""
        return self._flops(batch, batch, batch)


def param_count(cfg: MambaConfig) -> int:
    """Parameters of ``Mamba(cfg)``, from the config alone."""
    di, n, r = cfg.d_inner, cfg.d_state, cfg.dt_rank
    projections = cfg.dim * 2 * di + di * (r + 2 * n) + r * di + di * cfg.dim
    block = projections + di * (cfg.d_conv + 1) + di + di * n + di  # + conv, Δ bias, A_log, D
    return cfg.n_layers * (block + cfg.dim) + 2 * cfg.vocab_size * cfg.dim + cfg.dim
