"""What ``kernelfleet serve`` serves: a transformers causal LM from ``hf:DIR``, and its tokenizer
where the directory has one.

On the CPU the model runs in float32 (tiny models, exact comparisons with ``generate``). Loading
each device's share of the weights only (the place half's plans) plugs in here: a loader per
device, the backend built over what it loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.workloads.targets import causal_lm, checked_folder

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
    config = model.config
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos = eos if eos is not None else config.eos_token_id
    eos_ids = frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
    return Served(folder.resolve().name, model, _tokenizer(folder), eos_ids, config.vocab_size,
                  _context(config))


def model_folder(target: str) -> Path:
    """The directory of an ``hf:DIR`` target, checked (UsageError for any other kind of target)."""
    if not target.startswith("hf:"):
        raise UsageError(f"kernelfleet serve takes hf:DIR (a transformers causal LM directory), got {target!r}: "
                         "reference steps and MODULE:FACTORY targets are single steps, not generators")
    return checked_folder(Path(target[3:]))


def max_context_tokens(target: str) -> int:
    """The longest sequence the positions of ``target``'s model allow, from its config alone (the
    default when the config does not say)."""
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise EnvironmentProblem(f"serving needs transformers ({exc}): pip install transformers") from exc
    return _context(AutoConfig.from_pretrained(model_folder(target)))


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
