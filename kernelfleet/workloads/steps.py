"""One step of a workload, ready to capture: the callable, its static inputs and its module.

``kernelfleet analyze MODULE:FACTORY`` calls a factory with no arguments; the ones here build a
reference workload on the current CUDA device, e.g. ``kernelfleet.workloads.steps:llama_decode``.
Inputs are fixed tensors (a CUDA graph replays fixed addresses): tokens from a seeded generator,
decode positions at the middle of the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kernelfleet.errors import UsageError
from kernelfleet.workloads import build_preset


@dataclass
class Step:
    fn: Callable[..., Any]
    args: tuple
    module: torch.nn.Module
    name: str
    decode: Decode | None = None  # a decode step's inputs, for the multi-step gate


@dataclass(frozen=True)
class Decode:
    """What makes a step a decode step the gate can run for several steps: ``fn(*args)`` reads its
    new tokens from ``args[token]`` and their position from ``args[position]`` (both written in
    place between replays), and ``prompt`` (batch × positions) are the tokens the cache was filled
    with, so a teacher-forced run decodes the prompt's last positions again. A step with no
    position (``position`` None) is recurrent (an SSM's state): each step advances its state, so
    the gate runs steps one after another from the saved state, teacher-forced on the prompt's
    tokens."""

    token: int
    position: int | None
    prompt: torch.Tensor

    @property
    def recurrent(self) -> bool:
        return self.position is None


def make(family: str, preset: str = "tiny", phase: str = "decode", *, device: str = "cuda", seed: int = 0,
         compile: bool = False, batch: int | None = None, prompt_len: int | None = None) -> Step:
    """``phase``: ``prefill`` or ``decode`` for language models, ``denoise`` for ``dit``."""
    model = build_preset(family, preset, seed=seed, device=device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    if family == "dit":
        if phase != "denoise":
            raise UsageError(f"dit has one step, denoise; got {phase!r}")
        c = model.cfg
        args = (torch.randn(c.batch, c.latent_channels, c.latent_size, c.latent_size, generator=g).to(device),
                torch.full((c.batch,), 500.0, device=device))
        fn = model.denoise_step
    else:
        llm = model.cfg.llm if family == "vlm" else model.cfg
        b = batch or llm.max_batch
        if phase == "prefill":
            s = prompt_len or llm.max_seq_len // 2
            tokens = torch.randint(0, llm.vocab_size, (b, s), generator=g).to(device)
            if family == "vlm":
                v = model.cfg.vision
                images = torch.randn(b, v.channels, v.image_size, v.image_size, generator=g).to(device)
                args, fn = (tokens, images), model.prefill
            else:
                args, fn = (tokens,), model.prefill
        elif phase == "decode":
            args = (torch.randint(0, llm.vocab_size, (b,), generator=g).to(device),
                    torch.full((b,), llm.max_seq_len // 2, dtype=torch.long, device=device))
            fn = model.decode
        else:
            raise UsageError(f"{family} steps are prefill or decode; got {phase!r}")
    return Step(torch.compile(fn) if compile else fn, args, model,
                f"{family}-{preset}-{phase}{'-compiled' if compile else ''}")


def llama_decode() -> Step:
    return make("llama", "tiny", "decode")


def llama_prefill() -> Step:
    return make("llama", "tiny", "prefill")


def llama_decode_compiled() -> Step:
    return make("llama", "tiny", "decode", compile=True)


def llama8b_decode() -> Step:
    return make("llama", "h200", "decode")


def llama8b_prefill() -> Step:
    return make("llama", "h200", "prefill", batch=1, prompt_len=2048)


def hf_llama(phase: str = "prefill", *, device: str = "cuda", seed: int = 0, compile: bool = False) -> Step:
    """A small Llama built from a Hugging Face ``transformers`` config with random weights, its
    forward pass over a fixed prompt without a cache (a decode step's growing cache would not fit
    a static graph). Needs ``transformers``, which the place half does not otherwise depend on."""
    if phase != "prefill":
        raise UsageError(f"the transformers Llama step is prefill only; got {phase!r}")
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise UsageError(f"the transformers Llama step needs transformers ({exc}); pip install transformers") from exc
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval().requires_grad_(False)
    tokens = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(seed)).to(device)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    return Step(torch.compile(forward) if compile else forward, (tokens,), model,
                f"hf-llama-prefill{'-compiled' if compile else ''}")


def hf_llama_prefill() -> Step:
    return hf_llama("prefill")


def hf_llama_prefill_compiled() -> Step:
    return hf_llama("prefill", compile=True)


# The steps the GPU scripts and `kernelfleet bench disagg` run, by name: make()'s arguments, or
# another builder of this module (called with device and seed).
REFERENCE: dict[str, dict[str, Any]] = {
    "llama-decode": dict(family="llama", phase="decode"),
    "llama-prefill": dict(family="llama", phase="prefill"),
    "llama-decode-compiled": dict(family="llama", phase="decode", compile=True),
    "moe-decode": dict(family="moe", phase="decode"),
    "mamba-decode": dict(family="mamba", phase="decode"),
    "vlm-prefill": dict(family="vlm", phase="prefill"),
    "dit-denoise": dict(family="dit", phase="denoise"),
    "llama8b-decode": dict(family="llama", preset="h200", phase="decode"),
    "llama8b-prefill": dict(family="llama", preset="h200", phase="prefill", batch=1, prompt_len=2048),
    "moe20b-decode": dict(family="moe", preset="h200", phase="decode"),
    "mamba7b-decode": dict(family="mamba", preset="h200", phase="decode"),
    "vlm7b-prefill": dict(family="vlm", preset="h200", phase="prefill", batch=1, prompt_len=1024),
    "dit-h200-denoise": dict(family="dit", preset="h200", phase="denoise"),
    "hf-llama-prefill": dict(builder="hf_llama", phase="prefill"),
    "hf-llama-prefill-compiled": dict(builder="hf_llama", phase="prefill", compile=True),
}


def reference(name: str, *, device: str = "cuda", seed: int = 0) -> Step:
    """The reference step ``name`` (a key of REFERENCE) on ``device``."""
    if name not in REFERENCE:
        raise UsageError(f"unknown step {name!r}; expected one of {', '.join(REFERENCE)}")
    spec = dict(REFERENCE[name])
    if "builder" in spec:
        return globals()[spec.pop("builder")](spec.pop("phase"), device=device, seed=seed, **spec)
    family, phase = spec.pop("family"), spec.pop("phase")
    return make(family, spec.pop("preset", "tiny"), phase, device=device, seed=seed, **spec)
