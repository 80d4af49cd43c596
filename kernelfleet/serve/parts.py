"""Each pipeline stage's part of a model, built on its own device: only the parameters it reads.

A stage of layers ``[start, stop)`` is the model's own class, built on the meta device (nothing
allocated) and cut down: its decoder ``layers`` keep the stage's (each keeps the whole model's
``layer_idx``, so a stage's KV cache holds exactly its layers), the embedding stays on the first
stage only, the final norm and the head on the last only (elsewhere the norm is an identity and
the head is gone). Every stage builds its own rotary embedding (buffers computed from the config,
no parameters). Only then is what is left allocated on the device, and filled:

* from the directory's safetensors, one tensor at a time (``safe_open``; a sharded checkpoint's
  index says which file holds which), so a device never holds another stage's weights; or from
  an older ``pytorch_model.bin`` (sharded or not), memory-mapped (``torch.load(mmap=True)``), so
  only the pages of the stage's own tensors are read. Checkpoint
  names are the whole model's; an MoE's experts, saved one by one, are stacked into the fused
  tensors transformers 5 builds (``gate_up_proj``: each expert's gate then up rows);
* for a directory with only ``config.json``, with the seeded random weights a whole-model build
  draws. Those depend on every draw before them, so the whole model's construction is recorded
  once on the meta device (:class:`_Recording`: its tensors go to meta, but transformers is not
  told, so it initialises as in a real build, in the same order), and each stage replays the
  record from the seed: the initialisers of its own tensors run on them, and each random one of
  another stage's runs on a scratch tensor of the same shape, which draws from the generator
  exactly what the real tensor would have. Peak memory is the stage's weights and one tensor.

:func:`build_reading` builds the same way a device's share that is no stage: the whole model, of
which only the named parameters are allocated and filled; every other parameter is a view of one
zeroed scratch tensor (per dtype) as large as the largest of them, so the model still runs (and a
CUDA graph of it captures) while the kernels that read those parameters are never the device's
(``kernelfleet serve --plans``: each device holds the weights its plans' launches read), and
:func:`joined` makes the whole model of such shares again without allocating their weights.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from kernelfleet.errors import UsageError
from kernelfleet.serve.cut import StageSizes
from kernelfleet.serve.memory import kv_bytes
from kernelfleet.serve.model import capturable_experts, model_config, model_folder
from kernelfleet.workloads.targets import architecture, from_transformers

PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")  # what a base model must have to be cut into stages
CHECKPOINTS = ("model.safetensors", "pytorch_model.bin")  # each alone, or sharded with its .index.json


@dataclass(eq=False)
class Part:
    """One stage's module on its device: the model's class holding ``layers`` (the whole model's
    numbering), with the embedding if ``first`` and the norm and head if ``last``."""

    module: Any
    layers: range
    first: bool
    last: bool

    @property
    def base(self) -> Any:
        return getattr(self.module, self.module.base_model_prefix)


def stage_sizes(target: str, dtype: torch.dtype, context_tokens: int) -> StageSizes:
    """The sizes the cut weighs (cut.py), from ``target``'s config on the meta device."""
    config = model_config(model_folder(target))
    with torch.device("meta"):
        model = _architecture(config, dtype)
    base = _base(model, target)
    size = torch.empty(0, dtype=dtype).element_size()
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return StageSizes(weight_bytes(base.embed_tokens), [weight_bytes(layer) for layer in base.layers],
                      weight_bytes(base.norm) + weight_bytes(model.lm_head),
                      kv_bytes(1, kv_heads, head_dim, context_tokens, size),
                      text.vocab_size * (size + 4) + context_tokens, text.hidden_size * size + context_tokens)


def build_part(target: str, layers: range, device: str, seed: int, dtype: torch.dtype) -> Part:
    """The part of ``target``'s model that holds ``layers`` (module docstring), on ``device``."""
    folder = model_folder(target)
    config = model_config(folder)
    with torch.device("meta"):
        module = _architecture(config, dtype)
    count = len(_base(module, target).layers)
    part = Part(module, layers, layers.start == 0, layers.stop == count)
    names = _cut(part, config)
    module.to_empty(device=device)
    mine = dict(module.named_parameters())
    _fill(folder, config, module, {whole: mine[name] for name, whole in names.items()}, device, seed, dtype)
    return part


def build_reading(target: str, names: set[str], device: str, seed: int, dtype: torch.dtype) -> tuple[Any, int]:
    """``target``'s whole model on ``device`` holding only the parameters ``names`` (the whole
    model's names; module docstring), and the bytes of parameters it holds."""
    folder = model_folder(target)
    config = model_config(folder)
    module, params, kept, largest = _reading(target, config, names, dtype)
    scratch = {kind: torch.zeros(numel, dtype=kind, device=device) for kind, numel in largest.items()}
    made = {key: torch.nn.Parameter(torch.empty(tensor.shape, dtype=tensor.dtype, device=device) if key in kept
                                    else scratch[tensor.dtype][:tensor.numel()].view(tensor.shape), requires_grad=False)
            for key, (tensor, _) in params.items()}
    for owner in module.modules():
        for key, tensor in owner._parameters.items():
            if tensor is not None:
                owner._parameters[key] = made[id(tensor)]
    tensors = {held[0]: made[key] for key, (_, held) in params.items() if key in kept}
    _fill(folder, config, module, tensors, device, seed, dtype)
    return module, sum(t.numel() * t.element_size() for t in tensors.values())


def joined(models: list[tuple[Any, set[str] | None]]) -> Any:
    """One model whose every parameter is the tensor of the first of ``models`` (each a model of
    :func:`build_reading` and the names it holds, None: all) that holds it, nothing allocated but
    copies of the first one's buffers: under ``serve --plans`` the home device's view of the whole
    model where it holds only part (prefill and the gate's reference run on it). The models must be
    on one torch device (the partitions of one GPU share it); UsageError where a parameter is held
    by none of them."""
    first = models[0][0]
    device = next(first.parameters()).device
    memo: dict[int, Any] = {}
    for name, tensor in first.named_parameters(remove_duplicate=False):
        holder = next((model for model, names in models if names is None or name in names), None)
        if holder is None:
            raise UsageError(f"no device holds the weight {name}: the plans never read it, yet the model needs it")
        held = holder.get_parameter(name)
        if held.device != device:
            raise UsageError(f"{name} is held on {held.device}, the home device is {device}: joining a model across "
                             "GPUs is not supported")
        memo.setdefault(id(tensor), held)
    return copy.deepcopy(first, memo)


def reading_bytes(target: str, names: set[str], dtype: torch.dtype) -> int:
    """What :func:`build_reading` of ``names`` allocates for parameters: those it holds and the
    scratch the others view, from the config alone (the model is built on the meta device)."""
    _, params, kept, largest = _reading(target, model_config(model_folder(target)), names, dtype)
    held = sum(params[key][0].numel() * params[key][0].element_size() for key in kept)
    return held + sum(numel * torch.empty(0, dtype=kind).element_size() for kind, numel in largest.items())


def _reading(target: str, config: Any, names: set[str], dtype: torch.dtype) -> tuple[Any, dict, set[int], dict]:
    """The whole model on the meta device, its parameters (by id: the tensor and its names, a tied
    one several), the ids of those ``names`` holds, and per dtype the largest of the others (the
    scratch they view); UsageError for a name the model does not have."""
    with torch.device("meta"):
        module = _architecture(config, dtype)
    params: dict[int, tuple[torch.Tensor, list[str]]] = {}
    for name, tensor in module.named_parameters(remove_duplicate=False):
        params.setdefault(id(tensor), (tensor, []))[1].append(name)
    unknown = sorted(names - {name for _, held in params.values() for name in held})
    if unknown:
        raise UsageError(f"{target}: the model has no parameter {unknown[0]} (of {len(unknown)} asked for): "
                         "the plans were made for another model")
    kept = {key for key, (_, held) in params.items() if names.intersection(held)}
    largest: dict[torch.dtype, int] = {}
    for key, (tensor, _) in params.items():
        if key not in kept:
            largest[tensor.dtype] = max(largest.get(tensor.dtype, 0), tensor.numel())
    return module, params, kept, largest


def _fill(folder: Path, config: Any, module: Any, tensors: dict[str, torch.Tensor], device: str, seed: int,
          dtype: torch.dtype) -> None:
    """``tensors`` (by the whole model's names) filled from the directory's checkpoint, else with the
    seeded draws of a whole-model build; ``module``'s buffers built; its experts made capturable."""
    with torch.no_grad():
        checkpoint = next((kind for kind in CHECKPOINTS if (folder / kind).exists()
                           or (folder / f"{kind}.index.json").exists()), None)
        if checkpoint is not None:
            from_transformers(folder, "its checkpoint does not load",
                              lambda: _load(folder, checkpoint, tensors, device))
        else:
            _replayed(config, dtype, seed, tensors, device)
        _rebuilt_buffers(module, config, device)
    capturable_experts(module, device, dtype)


def _architecture(config: Any, dtype: torch.dtype) -> Any:
    return architecture(config, dtype).eval().requires_grad_(False)


def _base(model: Any, target: str) -> Any:
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None or not all(hasattr(base, name) for name in PARTS) or not hasattr(model, "lm_head"):
        raise UsageError(f"{target}: --strategy pipeline cuts models whose base holds embed_tokens, layers, norm and "
                         f"rotary_emb, and a lm_head (Llama, Qwen2, Qwen2-MoE, Mistral, ...); {type(model).__name__} "
                         "does not")
    return base


def _rebuilt_buffers(module: Any, config: Any, device: str) -> None:
    """Every submodule holding buffers built again on ``device`` from the config: a model built on
    the meta device holds no values in them (a rotary embedding's frequencies, its only buffers in
    the families served)."""
    for parent in list(module.modules()):
        for key, child in list(parent.named_children()):
            if next(child.buffers(recurse=False), None) is None:
                continue
            if next(child.parameters(recurse=False), None) is not None:
                raise UsageError(f"{type(child).__name__} holds both buffers and parameters: kernelfleet cannot build "
                                 "it on a device part by part")
            with torch.device(device):
                parent._modules[key] = type(child)(config=config.get_text_config())


def weight_bytes(module: Any) -> int:
    """The bytes of ``module``'s parameters (a tied one counted once)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _cut(part: Part, config: Any) -> dict[str, str]:
    """Cut ``part.module`` down to its stage; each parameter left, by its name there, and its name
    in the whole model (the checkpoint's)."""
    model, base, layers = part.module, part.base, part.layers
    prefix = f"{model.base_model_prefix}.layers."
    base.layers = torch.nn.ModuleList(list(base.layers)[layers.start:layers.stop])
    # the base model's forward runs its own layers, and reads each one's attention type by its place there
    base.config = copy.copy(config.get_text_config())
    base.config.num_hidden_layers = len(layers)
    if getattr(base.config, "layer_types", None):
        base.config.layer_types = base.config.layer_types[layers.start:layers.stop]
    if not part.first:
        base.embed_tokens = None
    if not part.last:
        base.norm, model.lm_head = torch.nn.Identity(), None
    names = {}
    for name, _ in model.named_parameters():
        if name.startswith(prefix):
            index, rest = name[len(prefix):].split(".", 1)
            names[name] = f"{prefix}{layers.start + int(index)}.{rest}"
        else:
            names[name] = name
    return names


def _load(folder: Path, checkpoint: str, tensors: dict[str, torch.Tensor], device: str) -> None:
    """Each of ``tensors`` (by its checkpoint name) from the directory's ``checkpoint`` files, one at a time."""
    index = folder / f"{checkpoint}.index.json"
    try:
        where = json.loads(index.read_text())["weight_map"] if index.exists() else {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"hf:{folder}: {index.name} is not a checkpoint index ({exc})") from exc
    opened: dict[str, Callable[[str], torch.Tensor | None]] = {}  # a file's reader of a name

    def read(name: str) -> torch.Tensor | None:
        file = where.get(name, checkpoint)
        if file not in opened:
            opened[file] = _reader(folder / file, device)
        return opened[file](name)

    for name, tensor in tensors.items():
        tensor.copy_(_saved(name, tensor, read, folder))


def _reader(path: Path, device: str) -> Callable[[str], torch.Tensor | None]:
    """A file's tensor by name (None where it holds none): safetensors opened on ``device``, a
    ``.bin`` memory-mapped on the CPU (its tensors copied to the device one by one)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            handle = safe_open(str(path), framework="pt", device=str(device))
            held = set(handle.keys())
            return lambda name: handle.get_tensor(name) if name in held else None
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # a missing, truncated or foreign file: which one, and what its reader said
        raise UsageError(f"hf:{path.parent}: {path.name} does not load ({type(exc).__name__}: {exc})") from exc
    if not isinstance(saved, dict):
        raise UsageError(f"hf:{path.parent}: {path.name} holds no state dict of tensors")
    return lambda name: saved.get(name)


def _saved(name: str, tensor: torch.Tensor, read: Callable[[str], torch.Tensor | None], folder: Path) -> torch.Tensor:
    """The checkpoint's value of ``name``: its own tensor, or an MoE's experts saved one by one (module docstring)."""
    found = read(name)
    if found is not None:
        return found
    experts = range(tensor.shape[0]) if tensor.dim() == 3 else range(0)
    if name.endswith("experts.gate_up_proj"):
        stem = name[:-len("gate_up_proj")]
        found = [[read(f"{stem}{e}.gate_proj.weight"), read(f"{stem}{e}.up_proj.weight")] for e in experts]
        if found and all(t is not None for pair in found for t in pair):
            return torch.stack([torch.cat(pair) for pair in found])
    if name.endswith("experts.down_proj"):
        stem = name[:-len("down_proj")]
        found = [read(f"{stem}{e}.down_proj.weight") for e in experts]
        if found and all(t is not None for t in found):
            return torch.stack(found)
    raise UsageError(f"hf:{folder}: its safetensors hold no tensor {name} (nor the experts it is stacked from)")


class _Recording(TorchFunctionMode):
    """Builds on the meta device and records every initialiser called on a meta tensor, in order
    (module docstring). ``torch.tensor`` stays on the CPU: transformers asks it which device a
    model is built under, and initialises nothing under meta."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Callable, torch.Tensor, tuple, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _device_constructors() and func is not torch.tensor and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        # torch.nn.init's functions come here with the tensor as a keyword, a tensor's methods as the first argument
        target = args[0] if args else kwargs.get("tensor")
        if getattr(func, "__name__", "").endswith("_") and isinstance(target, torch.Tensor) and target.is_meta:
            self.calls.append((func, target, tuple(args[1:]), {k: v for k, v in kwargs.items() if k != "tensor"}))
        return func(*args, **kwargs)


def _random(func: Callable) -> bool:
    name = func.__name__
    return any(word in name for word in ("normal", "uniform", "orthogonal", "sparse", "bernoulli", "random",
                                         "exponential", "geometric", "cauchy"))


def _replayed(config: Any, dtype: torch.dtype, seed: int, tensors: dict[str, torch.Tensor], device: str) -> None:
    """Fill ``tensors`` (by their names in the whole model) with what a whole-model build from ``seed`` draws."""
    recording = _Recording()
    with recording:
        whole = _architecture(config, dtype)
    names: dict[int, list[str]] = {}
    for name, tensor in whole.named_parameters(remove_duplicate=False):  # a tied tensor has two names
        names.setdefault(id(tensor), []).append(name)
    torch.manual_seed(seed)  # every device's generator: a whole-model build on this device draws from it
    for func, target, args, kwargs in recording.calls:
        # an initialiser may write a view of a parameter (an embedding's padding row): the same view of ours
        base = target if id(target) in names or target._base is None else target._base
        mine = next((tensors[n] for n in names.get(id(base), []) if n in tensors), None)
        if mine is not None and base is not target:
            mine = mine.as_strided(target.size(), target.stride(), target.storage_offset())
        if mine is None and not _random(func):
            continue
        into = mine if mine is not None else torch.empty(target.shape, dtype=target.dtype, device=device)
        func(into, *args, **kwargs)
