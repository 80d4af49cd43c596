"""Reference workloads for the place half: five model families with seeded random weights.

Every model is plain PyTorch, deterministic (seeded weights, no dropout, eval mode) and has static
shapes per step, with its cache or state preallocated and updated in place, so each step can be
captured into a CUDA graph kernel by kernel:

=========  ==========================  ============================================================
family     module                      steps
=========  ==========================  ============================================================
llama      ``llama.Transformer``       ``prefill(tokens)``, ``decode(token, position)``
moe        ``moe.MoETransformer``      same
mamba      ``mamba.Mamba``             same (``position`` ignored)
vlm        ``multimodal.VisionLanguageModel``  ``prefill(tokens, images)``, ``decode(token, position)``
dit        ``dit.DiT``                 ``denoise_step(latents, t)``
=========  ==========================  ============================================================

Each exposes its FLOPs per step (``prefill_flops``, ``decode_flops``, ``step_flops``) next to the
code they count; presets and their sizes are in ``config``; request streams in ``requests``.

    >>> from kernelfleet.workloads import build_preset
    >>> model = build_preset("llama", "h200", seed=0, device="cuda")

Importing this package imports nothing heavy; ``build_preset`` imports torch.
"""

from __future__ import annotations

from typing import Any

from kernelfleet.errors import UsageError

FAMILIES = ("llama", "moe", "mamba", "vlm", "dit")
PRESETS = ("tiny", "h200")


def _family(family: str) -> tuple[type, type, Any]:
    """(model class, config class, param_count) of a family, imported on demand."""
    from kernelfleet.workloads import config, dit, llama, mamba, moe, multimodal

    table = {
        "llama": (llama.Transformer, config.LlamaConfig, llama.param_count),
        "moe": (moe.MoETransformer, config.MoEConfig, moe.param_count),
        "mamba": (mamba.Mamba, config.MambaConfig, mamba.param_count),
        "vlm": (multimodal.VisionLanguageModel, config.MultimodalConfig, multimodal.param_count),
        "dit": (dit.DiT, config.DiTConfig, dit.param_count),
    }
    if family not in table:
        raise UsageError(f"unknown workload family {family!r}; expected one of {', '.join(FAMILIES)}")
    return table[family]


def preset(family: str, name: str) -> Any:
    """The config of ``family`` at preset ``name`` (``tiny`` or ``h200``)."""
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    return getattr(_family(family)[1], name)()


def param_count(family: str, name: str) -> int:
    """Parameters of a preset, computed from its config without building it."""
    return _family(family)[2](preset(family, name))


def build_preset(family: str, name: str, seed: int = 0, device: Any = "cpu", dtype: Any = None) -> Any:
    """Build ``family`` at preset ``name`` with weights seeded by ``seed`` (bf16 unless ``dtype``)."""
    from kernelfleet.workloads.layers import build

    return build(_family(family)[0], preset(family, name), seed=seed, device=device, dtype=dtype)
