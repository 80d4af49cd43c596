"""What a place command runs: a TARGET, named one of three ways, made on any device.

* a reference step, by name (``kernelfleet.workloads.steps.REFERENCE``: ``llama8b-decode``, ...);
* ``MODULE:FACTORY``: a function of yours that returns a step (README, "Your own model"); it is
  called on the device being captured (as the current CUDA device; with ``device=`` and ``seed=``
  where it takes them), and returns a :class:`~kernelfleet.workloads.steps.Step` or a tuple
  ``(fn, args[, module])``;
* ``hf:DIR[,PHASE][,batch=N][,tokens=N][,context=N]``: a transformers model directory, loaded with
  ``from_pretrained`` where it holds weights; a directory with only ``config.json`` gets random
  weights from the seed. ``prefill`` (the default): a fixed prompt of ``batch`` × ``tokens`` token
  ids, logits out. ``decode``: one token per sequence into a static KV cache of ``context``
  positions, ``context - 1`` of them filled by a prefill of a fixed prompt when the step is made;
  logits of the new token out. ``serve-decode``: the step ``kernelfleet serve`` replays for batch
  bucket ``batch`` over a cache of ``slots`` rows (default ``batch``) of ``context`` tokens
  (``serve/placed_step.py``; named as a factory, :data:`SERVE_DECODE`: the serve application imports
  this module, so this one cannot import it back).

The decode step keeps its own position (an input tensor) and writes it into the cache's counters
first: transformers' static cache advances a device counter on every call, so a captured graph
replayed as it is would write each replay one position further. With the counter reset, a replay
writes the same cache row with the same values and reads the same cache: a replay changes nothing
that the next replay reads, so the step needs no state restored between replays, and the cache is
named (``cache_L_keys``, ``cache_L_values``) so placement sees it as state. A recurrent model
(Mamba) has no positions: its decode step advances the convolution window and SSM state in place
(``state_L_J_conv``, ``state_L_J_ssm``), which kernelfleet saves and puts back before every replay.

:func:`step_maker` checks the target at once (a name, an importable factory, a directory with a
config) and returns ``make(device, seed)``: a place command captures one step per device and slot.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelfleet.errors import UsageError

PHASES = ("prefill", "decode", "serve-decode")  # of an hf:DIR target
SIZES = ("batch", "tokens", "context", "slots")
SERVE_DECODE = "kernelfleet.serve.placed_step:serve_decode"  # the server's own decode step (module docstring)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def step_maker(target: str, *, phase: str = "prefill", batch: int = 2, tokens: int = 64,
               context: int = 128) -> Callable[[str, int], Any]:
    """``make(device, seed) -> Step`` for ``target`` (module docstring; an ``hf:`` target's own
    options override the keywords); UsageError naming what is wrong with the target before
    anything is built."""
    from kernelfleet.workloads.steps import REFERENCE

    if target in REFERENCE:
        return lambda device, seed: _reference(target, device, seed)
    if target.startswith("hf:"):
        folder, *options = target[3:].split(",")
        sizes = {"batch": batch, "tokens": tokens, "context": context, "slots": None}
        for option in options:
            key, equals, value = option.partition("=")
            if not equals and key in PHASES:
                phase = key
            elif equals and key in SIZES and value.isdigit():
                sizes[key] = int(value)
            else:
                raise UsageError(f"{target}: option {option!r}: expected a phase ({', '.join(PHASES)}) or "
                                 f"{'|'.join(SIZES)}=N")
        if phase == "serve-decode":
            checked_folder(Path(folder))
            return _factory(SERVE_DECODE, {"model": folder, "batch": sizes["batch"], "context": sizes["context"],
                                           "slots": sizes["slots"]})
        if sizes.pop("slots") is not None:
            raise UsageError(f"{target}: slots=N is an option of the serve-decode phase only")
        return _transformers(Path(folder), phase, **sizes)
    if ":" in target:
        return _factory(target)
    raise UsageError(f"unknown step {target!r}: expected a reference step ({', '.join(REFERENCE)}), "
                     "MODULE:FACTORY or hf:DIR")


def load_step(target: str) -> tuple[Any, tuple, Any, str]:
    """``(fn, args, module, name)`` of ``target`` on the current CUDA device (``kernelfleet analyze``)."""
    import torch

    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return as_parts(step_maker(target)(device, 0), target)


def as_parts(made: Any, target: str) -> tuple[Any, tuple, Any, str]:
    """What a factory returned, checked: ``(fn, args, module, name)``."""
    if hasattr(made, "fn") and hasattr(made, "args"):
        return made.fn, tuple(made.args), getattr(made, "module", None), getattr(made, "name", target)
    if isinstance(made, tuple) and len(made) in (2, 3) and callable(made[0]):
        return made[0], tuple(made[1]), made[2] if len(made) == 3 else None, target
    raise UsageError(f"{target} returned {type(made).__name__}; expected (fn, args[, module]) or a Step")


def _reference(name: str, device: str, seed: int) -> Any:
    from kernelfleet.workloads.steps import reference

    return reference(name, device=device, seed=seed)


def _factory(target: str, options: dict[str, Any] | None = None) -> Callable[[str, int], Any]:
    """``make(device, seed)`` calling the factory ``target`` names (with ``options`` as keywords)."""
    module_name, _, factory_name = target.partition(":")
    if not module_name or not factory_name:
        raise UsageError(f"expected MODULE:FACTORY (e.g. kernelfleet.workloads.steps:llama_decode), got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UsageError(f"{module_name} has no callable {factory_name!r}")
    takes = inspect.signature(factory).parameters

    def make(device: str, seed: int) -> Any:
        import torch

        given = {**(options or {}), **{k: v for k, v in (("device", device), ("seed", seed)) if k in takes}}
        if device.startswith("cuda"):
            with torch.cuda.device(device):  # a factory builds on the current device
                made = factory(**given)
        else:
            made = factory(**given)
        from kernelfleet.workloads.steps import Step

        fn, args, step_module, name = as_parts(made, target)
        return Step(fn, args, step_module, name)

    return make


def _transformers(folder: Path, phase: str, batch: int, tokens: int, context: int) -> Callable[[str, int], Any]:
    checked_folder(folder)
    if phase not in PHASES:
        raise UsageError(f"hf:{folder}: unknown phase {phase!r}; the phases are {', '.join(PHASES)}")
    if batch < 1 or tokens < 1:
        raise UsageError(f"hf:{folder}: batch and tokens must be at least 1, got {batch} and {tokens}")
    if context < 2:
        raise UsageError(f"hf:{folder}: a decode context holds the prompt and the new token: at least 2, got {context}")

    def make(device: str, seed: int) -> Any:
        import torch

        from kernelfleet.workloads.steps import Step

        model = causal_lm(folder, device, seed, torch.bfloat16)
        vocabulary = model.config.vocab_size
        draw = torch.Generator().manual_seed(seed)
        if phase == "decode":
            prompt = torch.randint(0, vocabulary, (batch, context - 1), generator=draw).to(device)
            token = torch.randint(0, vocabulary, (batch, 1), generator=draw).to(device)
            return _decode(model, prompt, token, context, f"hf:{folder.name}-decode")
        ids = torch.randint(0, vocabulary, (batch, tokens), generator=draw).to(device)

        def prefill(input_ids: torch.Tensor) -> torch.Tensor:
            return model(input_ids=input_ids, use_cache=False).logits

        return Step(prefill, (ids,), model, f"hf:{folder.name}-prefill")

    return make


def _decode(model: Any, prompt: Any, token: Any, context: int, name: str) -> Any:
    """The decode step of the module docstring: the cache filled by ``prompt``, ``token`` next."""
    import torch
    from transformers import StaticCache

    from kernelfleet.workloads.steps import Decode, Step

    cache = StaticCache(config=model.config, max_cache_len=context)
    # transformers 5 renames past_key_values to cache; take whichever this version's forward has
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        model(input_ids=prompt, use_cache=True, **{key: cache})
    attention = [hasattr(layer, "cumulative_length") for layer in cache.layers]
    holder = torch.nn.Module()  # names the weights and the cache, so placement sees the cache as state
    holder.model = model
    if not any(attention):
        return _recurrent_decode(model, cache, key, holder, prompt, token, name)
    if not all(attention):
        raise UsageError(f"{name}: {type(model).__name__} mixes attention and recurrent layers; its decode step is not "
                         "built (use prefill)")
    counters = [layer.cumulative_length for layer in cache.layers]
    position = torch.tensor([context - 1], device=prompt.device)
    for i, layer in enumerate(cache.layers):
        holder.register_buffer(f"cache_{i}_keys", layer.keys)
        holder.register_buffer(f"cache_{i}_values", layer.values)

    def decode(new: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        for counter in counters:
            counter.copy_(at[0])
        return model(input_ids=new, use_cache=True, cache_position=at, position_ids=at.expand(new.shape[0], 1),
                     **{key: cache}).logits

    return Step(decode, (token, position), holder, name, Decode(0, 1, prompt))


def _recurrent_decode(model: Any, cache: Any, key: str, holder: Any, prompt: Any, token: Any, name: str) -> Any:
    """The decode step of a model whose cache is recurrent state only (Mamba's convolution window
    and SSM state, updated in place at fixed addresses): no position; the state, named as such, is
    what kernelfleet saves and puts back before every replay."""
    from kernelfleet.workloads.steps import Decode, Step

    for i, layer in enumerate(cache.layers):
        for j in range(layer.number_of_states):
            holder.register_buffer(f"state_{i}_{j}_conv", layer.conv_states[j])
            holder.register_buffer(f"state_{i}_{j}_ssm", layer.recurrent_states[j])

    def decode(new: Any) -> Any:
        return model(input_ids=new, use_cache=True, **{key: cache}).logits

    return Step(decode, (token,), holder, name, Decode(0, None, prompt))


def checked_folder(folder: Path) -> Path:
    """``folder`` if it is a transformers model directory (it has a config.json), else UsageError."""
    if not (folder / "config.json").is_file():
        raise UsageError(f"hf:{folder}: no config.json there (a transformers model directory, as save_pretrained "
                         "writes it)")
    return folder


def causal_lm(folder: Path, device: str, seed: int, dtype: Any) -> Any:
    """The causal LM of a model directory on ``device``, in eval mode: its weights where it holds
    them, else its architecture with weights drawn from ``seed`` on ``device`` itself (an 8B
    Llama's draws take minutes on a CPU, seconds on a GPU; the CPU's draws differ from a GPU's)."""
    import torch

    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise UsageError(f"hf: targets need transformers ({exc}): pip install transformers") from exc
    if any((folder / name).exists() for name in WEIGHT_FILES):
        model = from_transformers(folder, "its model does not load",
                                  lambda: AutoModelForCausalLM.from_pretrained(folder, dtype=dtype))
    else:  # a config alone: the model's architecture with weights drawn from the seed
        config = config_of(folder)
        torch.manual_seed(seed)  # seeds every device's generator: the same weights every build
        with torch.device(device):
            model = architecture(config, dtype)
    return model.to(device).eval().requires_grad_(False)


def config_of(folder: Path) -> Any:
    """The transformers config of the model directory ``folder`` (UsageError, one line, where it
    does not load)."""
    from transformers import AutoConfig

    return from_transformers(folder, "its config.json does not load as a transformers config",
                             lambda: AutoConfig.from_pretrained(folder))


def architecture(config: Any, dtype: Any) -> Any:
    """The causal LM ``config`` (of :func:`config_of`) describes, built on the current device with
    the weights its initialisers draw (UsageError, one line naming its directory, where it builds
    none)."""
    from transformers import AutoModelForCausalLM

    return from_transformers(Path(config.name_or_path), "its config does not build a transformers causal LM",
                             lambda: AutoModelForCausalLM.from_config(config, dtype=dtype))


def from_transformers(folder: Path, what: str, read: Callable[[], Any]) -> Any:
    """``read()``, transformers reading the model directory ``folder``; where it fails, a UsageError
    of one line saying ``what`` and why (the library's message on one line, cut at 240 characters).
    A directory can hold anything, and transformers, huggingface_hub and safetensors refuse it with
    OSError, ValueError, TypeError, KeyError, RecursionError or errors of their own. torch running
    out of memory is not the directory's fault: it passes (the command line says it)."""
    try:
        return read()
    except UsageError:
        raise
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError":
            raise
        said = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"hf:{folder}: {what} ({said[:240]})") from None
