"""A vision-language model (Qwen2.5-VL-like at small scale): ViT encoder → 2x2 merger → dense LLM.

``prefill(tokens, images)`` encodes ``images`` [B, C, H, W] into ``n_image_tokens`` embeddings,
prepends them to the text embeddings and prefills the LLM over both; the first decode position is
therefore ``n_image_tokens + text_len``. ``decode`` is the LLM's.

The encoder is a plain pre-norm ViT (linear patch embedding, learned absolute positions,
bidirectional attention, GELU MLP). Left out of Qwen2.5-VL: 2-D RoPE and windowed attention in
the ViT, SwiGLU/RMSNorm in the ViT, M-RoPE (3-D positions) in the LLM, dynamic resolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernelfleet.workloads.config import MultimodalConfig, VisionConfig
from kernelfleet.workloads.layers import SelfAttention, seeded_init_
from kernelfleet.workloads.llama import Transformer
from kernelfleet.workloads.llama import param_count as llm_param_count


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, H, W] → [B, (H/p)·(W/p), C·p·p], patches in row-major order."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


class ViTBlock(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(cfg.dim), SelfAttention(cfg.dim, cfg.n_heads)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc1, self.fc2 = nn.Linear(cfg.dim, cfg.mlp_dim), nn.Linear(cfg.mlp_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VisionEncoder(nn.Module):
    """Patches → ViT → merge each ``merge``x``merge`` square of patches → MLP to the LLM width."""

    def __init__(self, cfg: VisionConfig, llm_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.channels * cfg.patch_size**2, cfg.dim)
        self.pos_embed = nn.Parameter(torch.empty(1, cfg.n_patches, cfg.dim))
        self.blocks = nn.ModuleList(ViTBlock(cfg) for _ in range(cfg.n_layers))
        merged = cfg.dim * cfg.merge**2
        self.merge_norm = nn.LayerNorm(cfg.dim)
        self.merge_fc1, self.merge_fc2 = nn.Linear(merged, merged), nn.Linear(merged, llm_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, C, H, W] → image-token embeddings [B, n_image_tokens, llm_dim]."""
        cfg = self.cfg
        pixels = patchify(images, cfg.patch_size).to(self.patch_embed.weight.dtype)  # callers pass float32
        x = self.patch_embed(pixels) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.merge_norm(x)
        # Group each m x m square of neighbouring patches into one vector (Qwen2-VL's PatchMerger).
        b, g, m = x.shape[0], cfg.image_size // cfg.patch_size, cfg.merge
        x = x.reshape(b, g // m, m, g // m, m, cfg.dim).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(b, (g // m) ** 2, m * m * cfg.dim)
        return self.merge_fc2(F.gelu(self.merge_fc1(x)))

    def flops(self, batch: int) -> int:
        """Matmul and attention FLOPs for ``batch`` images (bidirectional: n_patches² pairs)."""
        cfg = self.cfg
        n, d = cfg.n_patches, cfg.dim
        per_patch = 2 * (4 * d * d + 2 * d * cfg.mlp_dim)
        attn = 4 * d * n * n
        merged = d * cfg.merge**2
        llm_dim = self.merge_fc2.out_features
        merger = 2 * cfg.n_image_tokens * (merged * merged + merged * llm_dim)
        patch = 2 * n * cfg.channels * cfg.patch_size**2 * d
        return batch * (patch + cfg.n_layers * (per_patch * n + attn) + merger)


class VisionLanguageModel(nn.Module):
    """Vision encoder + dense LLM sharing one KV cache for image and text positions."""

    def __init__(self, cfg: MultimodalConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg.vision, cfg.llm.dim)
        self.llm = Transformer(cfg.llm)

    def reset_parameters(self, seed: int) -> None:
        """Seeded N(0, 0.02) weights (LayerNorm weights are named ``norm`` and start at one)."""
        seeded_init_(self, seed)

    def reset_state(self) -> None:
        """Zero the LLM's KV cache in place."""
        self.llm.reset_state()

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """Image tokens then ``tokens`` [B, S] at positions 0..; logits of the last position, [B, vocab]."""
        h = torch.cat([self.vision(images).type_as(self.llm.embed.weight), self.llm.embed(tokens)], dim=1)
        return self.llm.prefill_embeds(h)

    @torch.no_grad()
    def decode(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One text token per row at ``position`` [B] (counting the image tokens); logits [B, vocab]."""
        return self.llm.decode(token, position)

    def prefill_flops(self, batch: int, text_len: int, executed: bool = False) -> int:
        """Encoder + merger FLOPs plus the LLM prefill over image and text tokens."""
        return self.vision.flops(batch) + self.llm.prefill_flops(
            batch, self.cfg.vision.n_image_tokens + text_len, executed)

    def decode_flops(self, batch: int, context: int, executed: bool = False) -> int:
        return self.llm.decode_flops(batch, context, executed)


def param_count(cfg: MultimodalConfig) -> int:
    """Parameters of ``VisionLanguageModel(cfg)``, from the config alone."""
    v = cfg.vision
    d, merged = v.dim, v.dim * v.merge**2
    block = 4 * d * d + 4 * d + 2 * d * v.mlp_dim + v.mlp_dim + d + 4 * d
    vision = (v.channels * v.patch_size**2 + 1) * d + v.n_patches * d + v.n_layers * block + 2 * d
    merger = merged * merged + merged + merged * cfg.llm.dim + cfg.llm.dim
    return vision + merger + llm_param_count(cfg.llm)
