"""Opt-in: a few lines in a training or inference script hand the job's useful FLOPs to
the local agent, which then reports the job's MFU beside its OFU and flags a job whose
own MFU figure disagrees with the counters (the OFU paper found two framework
FLOP-count bugs this way).

    from kernelfleet.hook import Tracker

    tracker = Tracker(reported_mfu=lambda: trainer.mfu)      # reported_mfu is optional
    for batch in loader:
        with tracker.step():
            loss = model(batch); loss.backward(); optimizer.step()

It needs PyTorch (the job has it; the agent does not). FLOPs come from PyTorch's own formulas (``torch.utils.flop_counter.flop_registry``:
matmuls, convolutions, attention, forward and backward), counted per precision from
the operands' dtype, with the GEMM shapes kept for the tile correction. Counting runs
inside a ``TorchDispatchMode``, so it costs host time on every op: enable it on a
sample of steps (``every``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

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


def precision_of(dtype: torch.dtype) -> str:
    """The catalog precision a matmul on this dtype runs at (fp32 is tf32 when PyTorch allows it)."""
    if dtype == torch.float32:
        return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"
    return _PRECISION.get(dtype, str(dtype).removeprefix("torch."))


class FlopCount(TorchDispatchMode):
    """Useful FLOPs per precision, and how often each (op, shapes, dtype) ran."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()
        self.shapes: Counter[tuple[str, tuple[tuple[int, ...], ...], str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        counted = op_flops(func, args, kwargs, out)
        if counted is not None:
            precision, flops = counted
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.flops[precision] += flops
            self.shapes[func._overloadpacket.__name__, tuple(tuple(t.shape) for t in tensors[:3]),
                        str(tensors[0].dtype if tensors else torch.float32)] += 1
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


def post_json(url: str, body: dict[str, Any], token: str | None) -> None:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    urllib.request.urlopen(request, timeout=2).read()


class Tracker:
    """Counts a sample of steps and reports them to the agent every ``report_seconds``.

    A report that cannot reach the agent is dropped with no exception: the hook must
    never break the job it watches.
    """

    def __init__(
        self,
        agent_url: str = "http://127.0.0.1:9400",
        every: int = 10,
        report_seconds: float = 30.0,
        reported_mfu: Callable[[], float | None] | None = None,
        token: str | None = None,
        send: Callable[[str, dict[str, Any], str | None], None] = post_json,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.url = agent_url.rstrip("/") + "/api/hook"
        self.every = max(1, every)
        self.report_seconds = report_seconds
        self.reported_mfu = reported_mfu
        self.token = token if token is not None else os.environ.get("KERNELFLEET_TOKEN")
        self.send = send
        self.clock = clock
        self.steps = 0
        self._pending: dict[str, Any] = self._empty()
        self._last_report = clock()

    def _empty(self) -> dict[str, Any]:
        return {"steps": 0, "seconds": 0.0, "flops": Counter(), "shapes": Counter()}

    @contextmanager
    def step(self) -> Iterator[None]:
        """Wrap one step; every ``every``-th step is counted and timed."""
        self.steps += 1
        if self.steps % self.every:
            yield
            return
        counter = FlopCount()
        _synchronize()
        start = self.clock()
        with counter:
            yield
        _synchronize()
        pending = self._pending
        pending["steps"] += 1
        pending["seconds"] += self.clock() - start
        pending["flops"].update(counter.flops)
        pending["shapes"].update(counter.shapes)
        if self.clock() - self._last_report >= self.report_seconds:
            self.flush()

    def flush(self) -> None:
        """Send what was counted since the last report."""
        pending, self._pending = self._pending, self._empty()
        self._last_report = self.clock()
        if not pending["steps"]:
            return
        body = {
            "pid": os.getpid(),
            "steps": pending["steps"],
            "seconds": pending["seconds"],
            "useful_flops": dict(pending["flops"]),
            "gemms": [{"op": op, "shapes": [list(s) for s in shapes], "dtype": dtype, "count": n}
                      for (op, shapes, dtype), n in pending["shapes"].most_common(32)],
            "reported_mfu": self.reported_mfu() if self.reported_mfu else None,
        }
        try:
            self.send(self.url, body, self.token)
        except OSError:
            pass  # the agent is down or unreachable: the job goes on


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
