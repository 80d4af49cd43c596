"""Useful FLOPs of ATen ops, per precision, from PyTorch's own formulas
(``torch.utils.flop_counter.flop_registry``: matmuls, convolutions, attention, forward and
backward), counted under a ``TorchDispatchMode``. It needs torch but no device; the job hook
(``kernelfleet.hook``) and the kernel capture (``kernels.cuda.capture``) both count with it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

_PRECISION = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64_tensor", torch.int8: "int8",
    torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8",
}


# Ops PyTorch's registry leaves out: the CPU's fused attention (same FLOPs as flash attention).
_CPU_ATTENTION = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_EXTRA: dict[Any, Callable[..., int]] = {
    op: lambda query, key, value, *args, **kwargs: sdpa_flop_count(query.shape, key.shape, value.shape)
    for op in (_CPU_ATTENTION,) if op is not None
}

# The ops whose calls pair with a GEMM kernel each (attention and convolution kernels state no tile).
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})
Call = tuple[str, tuple[tuple[int, ...], ...], str]  # (ATen op, operand shapes, precision)


def precision_of(dtype: torch.dtype) -> str:
    """The catalog precision a matmul on this dtype runs at (fp32 is tf32 when PyTorch allows it)."""
    if dtype == torch.float32:
        return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"
    return _PRECISION.get(dtype, str(dtype).removeprefix("torch."))


class FlopCount(TorchDispatchMode):
    """Useful FLOPs per precision, and how often each (op, shapes, dtype) ran; with
    ``ordered``, also every matmul call in the order it was dispatched (``calls``)."""

    def __init__(self, ordered: bool = False) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()
        self.shapes: Counter[tuple[str, tuple[tuple[int, ...], ...], str]] = Counter()
        self.calls: list[Call] | None = [] if ordered else None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        counted = op_flops(func, args, kwargs, out)
        if counted is not None:
            precision, flops = counted
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            name = func._overloadpacket.__name__
            shapes = tuple(tuple(t.shape) for t in tensors[:3])
            self.flops[precision] += flops
            self.shapes[name, shapes, str(tensors[0].dtype if tensors else torch.float32)] += 1
            if self.calls is not None and name in MATMUL_OPS:
                self.calls.append((name, shapes, precision))
        return out


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[str, int] | None:
    """(precision, useful FLOPs) of one ATen op call, or None for an op PyTorch counts no FLOPs for."""
    packet = func._overloadpacket
    if packet not in flop_registry and packet not in _EXTRA:
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dtype = tensors[0].dtype if tensors else torch.float32
    if packet in flop_registry:
        flops = flop_registry[packet](*args, **kwargs, out_val=out)
    else:
        flops = _EXTRA[packet](*args, **kwargs)
    return precision_of(dtype), int(flops)
