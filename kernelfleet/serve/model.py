"""What ``kernelfleet serve`` serves: a transformers causal LM from ``hf:DIR``, and its tokenizer
where the directory has one.

On the CPU the model runs in float32 (tiny models, exact comparisons with ``generate``). On a GPU
a directory with only ``config.json`` is built there directly, its architecture constructed under
the device (an 8B Llama's random bf16 weights are drawn on the GPU, never staged on the CPU);
saved weights load with ``from_pretrained`` and move there. :func:`footprint` sizes
it from the config alone, on torch's meta device, before anything is allocated. Loading each
device's share of the weights only is ``parts.py``'s (the layer pipeline); :func:`described` is the model
as the API sees it, without loading it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.serve.memory import Footprint, kv_bytes
from kernelfleet.workloads.targets import architecture, causal_lm, checked_folder, config_of

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
DEFAULT_CONTEXT_TOKENS = 4096  # per slot, when the model allows more: a CPU's memory, not the model, is the limit


@dataclass(frozen=True)
class Served:
    """A loaded model: its id in the API, the model, its tokenizer (None without one) and limits."""

    name: str
    model: Any
    tokenizer: Any | None
    eos_token_ids: frozenset[int]
    vocab_size: int
    max_context_tokens: int


def load(target: str, device: str = "cpu", seed: int = 0, dtype: torch.dtype = torch.float32) -> Served:
    """``hf:DIR`` loaded on ``device`` (UsageError for any other kind of target)."""
    folder = model_folder(target)
    model = causal_lm(folder, device, seed, dtype)
    capturable_experts(model, device, dtype)
    return _served(folder, model, model.config, model.generation_config)


def capturable_experts(model: Any, device: str, dtype: torch.dtype) -> None:
    """An MoE's experts set to run in a form a CUDA graph captures on a GPU in ``dtype``."""
    if device != "cpu" and dtype != torch.bfloat16 and model._can_set_experts_implementation():
        # grouped_mm's fused kernel is bf16 only; in other dtypes torch loops over the groups with
        # their sizes read on the host, which no graph can capture. batched_mm gathers each token's
        # experts and multiplies them in one batched matmul: any dtype, no host read
        model.set_experts_implementation("batched_mm")


def described(target: str) -> Served:
    """``hf:DIR``'s model as the API sees it (its id, tokenizer, end tokens and limits) without the
    model itself: under ``--strategy pipeline`` each device builds its own part (parts.py)."""
    from transformers import GenerationConfig

    folder = model_folder(target)
    config = model_config(folder)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json: what transformers derives from the model's config
        generation = GenerationConfig.from_model_config(config)
    return _served(folder, None, config, generation)


def _served(folder: Path, model: Any, config: Any, generation: Any) -> Served:
    eos = generation.eos_token_id if generation is not None else None
    eos = eos if eos is not None else config.eos_token_id
    eos_ids = frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
    return Served(folder.resolve().name, model, _tokenizer(folder), eos_ids, config.get_text_config().vocab_size,
                  _context(config))


def model_folder(target: str) -> Path:
    """The directory of an ``hf:DIR`` target, checked (UsageError for any other kind of target)."""
    if not target.startswith("hf:"):
        raise UsageError(f"kernelfleet serve takes hf:DIR (a transformers causal LM directory), got {target!r}: "
                         "reference steps and MODULE:FACTORY targets are single steps, not generators")
    return checked_folder(Path(target[3:]))


def footprint(target: str, dtype: torch.dtype, context_tokens: int) -> Footprint:
    """The sizes of ``target``'s model in ``dtype`` with ``context_tokens`` per slot (memory.py),
    from its config: the model is built on the meta device, which allocates nothing."""
    config = model_config(model_folder(target))
    with torch.device("meta"):
        model = architecture(config, dtype)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    layers, size = text.num_hidden_layers, torch.empty(0, dtype=dtype).element_size()
    per_slot = kv_bytes(layers, kv_heads, head_dim, context_tokens, size)
    return Footprint(weights, per_slot, text.vocab_size * (size + 4) + context_tokens)


def max_context_tokens(target: str) -> int:
    """The longest sequence the positions of ``target``'s model allow, from its config alone (the
    default when the config does not say)."""
    return _context(model_config(model_folder(target)))


def model_config(folder: Path) -> Any:
    """The directory's transformers config (EnvironmentProblem without transformers; UsageError, one
    line, for a config.json it cannot read)."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise EnvironmentProblem(f"serving needs transformers ({exc}): pip install transformers") from exc
    return config_of(folder)


def _context(config: Any) -> int:
    return getattr(config, "max_position_embeddings", None) or DEFAULT_CONTEXT_TOKENS


def _tokenizer(folder: Path) -> Any | None:
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:  # files there but unusable: serve token ids, and say why
        log.warning("hf:%s: its tokenizer does not load (%s); prompts must be token ids", folder, exc)
        return None
