"""Configs for the five reference model families, as plain data (torchtitan style).

Each family has two presets: ``tiny()`` runs a step on a CPU in milliseconds (tests), ``h200()`` is
shaped after the model Tessera evaluates (PAPERS.md, section B) and fits one H200 (141 GB) with its
weights in bf16 plus a preallocated cache. Parameter counts are what ``param_count`` in each model
module computes (checked against the built tiny models in tests/unit/test_workloads.py):

=========  ======================================  ==========  ===============  ====================
family     shaped after                            parameters  weights (bf16)   cache/state (bf16)
=========  ======================================  ==========  ===============  ====================
llama      Llama-3.1-8B (all 32 layers)            8.03 B      16.1 GB          KV 8.6 GB, 16 x 4096
moe        gpt-oss-20B (24 layers, 32 experts)     20.91 B     41.8 GB          KV 3.2 GB, 16 x 4096
           (4.19 B active per token, top-4)
mamba      Mamba-Codestral-7B size, Mamba-1 block  7.01 B      14.0 GB          0.32 GB, 16 rows
vlm        Qwen2.5-VL-7B (ViT 32L + Qwen2.5-7B)    8.15 B      16.3 GB          KV 3.8 GB, 16 x 4096
dit        SD3.5-medium size, single-stream DiT    1.03 B      2.1 GB           none (batch 8)
=========  ======================================  ==========  ===============  ====================

Sizes are computed from the configs, not yet measured on an H200. Weights plus cache leave more than
90 GB for activations in every family (the MoE prefill at 16 x 4096 holds expert tensors of
[32, 16384, 2880], about 3 GB each in bf16).

What the compact models leave out is said in each module's docstring (no RoPE scaling, no sliding
window or attention sinks, Mamba-1 rather than Mamba-2, 1-D rather than M-RoPE, no text stream).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; configs keep the name so they stay plain data."""
    return getattr(torch, name)


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """A dense decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # explicit: gpt-oss has n_heads * head_dim != dim
    ffn_dim: int
    max_batch: int
    max_seq_len: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"

    @classmethod
    def tiny(cls) -> LlamaConfig:
        return cls(vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                   ffn_dim=160, max_batch=2, max_seq_len=32)

    @classmethod
    def h200(cls) -> LlamaConfig:
        # Llama-3.1-8B exactly (config.json of meta-llama/Llama-3.1-8B), minus rope scaling.
        return cls(vocab_size=128_256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                   ffn_dim=14_336, max_batch=16, max_seq_len=4096)


@dataclass(frozen=True, kw_only=True)
class MoEConfig(LlamaConfig):
    """The dense skeleton with a top-k routed expert MLP (``ffn_dim`` is each expert's width).

    ``capacity_factor`` sets how many token slots each expert gets per step:
    ``ceil(capacity_factor * tokens * top_k / n_experts)``, at most ``tokens``. ``None`` means
    dropless (every expert has room for every token), which costs ``n_experts / top_k`` times the
    useful expert FLOPs; a factor f costs about f times and drops tokens past an expert's capacity.
    """

    n_experts: int
    top_k: int
    capacity_factor: float | None = None

    @classmethod
    def tiny(cls) -> MoEConfig:
        return cls(vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=48,
                   n_experts=8, top_k=2, max_batch=2, max_seq_len=32)

    @classmethod
    def h200(cls) -> MoEConfig:
        # gpt-oss-20B shapes (openai/gpt-oss-20b config.json); weights bf16 instead of MXFP4.
        return cls(vocab_size=201_088, dim=2880, n_layers=24, n_heads=64, n_kv_heads=8, head_dim=64,
                   ffn_dim=2880, n_experts=32, top_k=4, capacity_factor=2.0, rope_theta=150_000.0,
                   max_batch=16, max_seq_len=4096)


@dataclass(frozen=True, kw_only=True)
class MambaConfig:
    """A stack of Mamba-1 selective-SSM blocks (pre-RMSNorm, residual)."""

    vocab_size: int
    dim: int
    n_layers: int
    d_state: int
    d_conv: int
    expand: int
    dt_rank: int
    max_batch: int
    max_seq_len: int
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"

    @property
    def d_inner(self) -> int:
        return self.expand * self.dim

    @classmethod
    def tiny(cls) -> MambaConfig:
        return cls(vocab_size=96, dim=32, n_layers=2, d_state=8, d_conv=4, expand=2, dt_rank=4,
                   max_batch=2, max_seq_len=32)

    @classmethod
    def h200(cls) -> MambaConfig:
        # Mamba-Codestral-7B's width, depth and vocabulary (dim 4096, 64 layers, 32768) with a
        # Mamba-1 block (d_state 16, dt_rank dim/16) in place of its Mamba-2 SSD block.
        return cls(vocab_size=32_768, dim=4096, n_layers=64, d_state=16, d_conv=4, expand=2, dt_rank=256,
                   max_batch=16, max_seq_len=4096)


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """A ViT patch encoder; ``merge`` x ``merge`` neighbouring patches become one LLM token."""

    image_size: int
    patch_size: int
    channels: int
    dim: int
    n_layers: int
    n_heads: int
    mlp_dim: int
    merge: int = 2

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def n_image_tokens(self) -> int:
        return self.n_patches // (self.merge * self.merge)


@dataclass(frozen=True, kw_only=True)
class MultimodalConfig:
    """Vision encoder + projector + dense LLM; image tokens are prepended to the text tokens."""

    vision: VisionConfig
    llm: LlamaConfig

    @property
    def dtype(self) -> str:
        return self.llm.dtype

    @classmethod
    def tiny(cls) -> MultimodalConfig:
        vision = VisionConfig(image_size=16, patch_size=4, channels=3, dim=32, n_layers=2, n_heads=2,
                              mlp_dim=64)
        return cls(vision=vision, llm=LlamaConfig.tiny())

    @classmethod
    def h200(cls) -> MultimodalConfig:
        # Qwen2.5-VL-7B: ViT 32 layers x 1280 (patch 14, 2x2 merge) on a 448x448 image = 256 image
        # tokens, and the Qwen2.5-7B language model (28 layers, GQA 28/4, vocab 152064).
        vision = VisionConfig(image_size=448, patch_size=14, channels=3, dim=1280, n_layers=32, n_heads=16,
                              mlp_dim=3420)
        llm = LlamaConfig(vocab_size=152_064, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128,
                          ffn_dim=18_944, rope_theta=1_000_000.0, norm_eps=1e-6, max_batch=16,
                          max_seq_len=4096)
        return cls(vision=vision, llm=llm)


@dataclass(frozen=True, kw_only=True)
class DiTConfig:
    """A DiT over a latent image: patchify, timestep embedding, adaLN-Zero blocks, unpatchify."""

    latent_size: int
    latent_channels: int
    patch_size: int
    dim: int
    n_layers: int
    n_heads: int
    mlp_ratio: int
    batch: int
    freq_dim: int = 256  # width of the sinusoidal timestep features
    adaln_zero_init: bool = True  # False gives random modulation weights (non-trivial outputs)
    dtype: str = "bfloat16"

    @property
    def n_tokens(self) -> int:
        return (self.latent_size // self.patch_size) ** 2

    @classmethod
    def tiny(cls) -> DiTConfig:
        return cls(latent_size=8, latent_channels=4, patch_size=2, dim=32, n_layers=2, n_heads=2, mlp_ratio=4,
                   batch=2, freq_dim=32)

    @classmethod
    def h200(cls) -> DiTConfig:
        # SD3.5-medium's latent (16 channels, 128x128 for a 1024x1024 image, patch 2 → 4096 tokens)
        # and width/depth (1536, 24 blocks, 24 heads), as one image stream without the text stream.
        return cls(latent_size=128, latent_channels=16, patch_size=2, dim=1536, n_layers=24, n_heads=24,
                   mlp_ratio=4, batch=8)
