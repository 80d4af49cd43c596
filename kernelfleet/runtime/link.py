"""How the plan executor moves bytes between devices inside one CUDA graph (runs on GPUs).

A copy is, in order of preference, a memcpy node (copy engines, peer copy over NVLink), the node
stream capture makes for ``cuMemcpyAsync`` (as a child graph), or a kernel of ``link.ptx`` run on
the destination device (pulling over peer access). The driver refused memcpy nodes inside the
executor on the H200 once (``CUDA_ERROR_INVALID_VALUE``) while accepting them in a fresh process;
the executor therefore probes the methods in that order and keeps the first that the driver takes.

A link can be throttled to emulate slower interconnects (25-200 Gbit/s networks) than NVLink:
beside each copy runs a one-thread kernel that waits ``latency + bytes / bandwidth`` on the GPU's
global timer, and the copy's readers wait for both, so a transfer takes max(real copy, emulated
link). Copies on one link are chained by the schedule, so they also queue as on a real link.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from importlib import resources
from typing import Any

from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver

METHODS = ("memcpy", "captured", "kernel")
_BLOCK = 256
_MAX_BLOCKS = 264  # two per H200 SM: enough blocks in flight to saturate HBM or NVLink


@dataclass(frozen=True, slots=True)
class Throttle:
    """An emulated link: bytes per second and a per-copy latency."""

    bytes_per_second: float
    latency_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.bytes_per_second > 0 or self.latency_seconds < 0:
            raise UsageError(f"a link needs a positive bandwidth and a latency >= 0, got "
                             f"{self.bytes_per_second} B/s and {self.latency_seconds} s")

    def seconds(self, length_bytes: int) -> float:
        return self.latency_seconds + length_bytes / self.bytes_per_second


class LinkKernels:
    """``link.ptx`` loaded in one context (modules belong to a context) by ``driver``, which then
    adds and launches its kernels; ``close`` unloads it."""

    def __init__(self, ctx: Any, driver: CudaDriver = CUDA) -> None:
        ptx = resources.files("kernelfleet.runtime").joinpath("link.ptx").read_text()
        self.ctx, self.driver = ctx, driver
        self.module, self.functions = driver.load_module(ptx, ["kf_copy16", "kf_copy1", "kf_wait"], ctx)

    def copy(self, graph: Any, after: list[Any], dst: int, src: int, length: int) -> Any:
        aligned = (dst | src | length) % 16 == 0
        items = length // 16 if aligned else length
        blocks = max(1, min(_MAX_BLOCKS, math.ceil(items / _BLOCK)))
        return self.driver.add_kernel(graph, after, self.functions["kf_copy16" if aligned else "kf_copy1"],
                                 (blocks, 1, 1), (_BLOCK, 1, 1), [_u64(dst), _u64(src), _u64(items)], self.ctx)

    def wait(self, graph: Any, after: list[Any], seconds: float) -> Any:
        return self.driver.add_kernel(graph, after, self.functions["kf_wait"], (1, 1, 1), (1, 1, 1),
                                 [_u64(round(seconds * 1e9))], self.ctx)

    def wait_on(self, stream: int, seconds: float) -> None:
        """The same wait, launched now on ``stream`` (a stream of ``ctx``)."""
        self.driver.launch_function(self.functions["kf_wait"], (1, 1, 1), (1, 1, 1), 0, [_u64(round(seconds * 1e9))], stream)

    def close(self) -> None:
        self.driver.unload_module(self.module)


def add_copy(method: str, graph: Any, after: list[Any], dst: int, src: int, length: int,
             kernels: LinkKernels) -> Any:
    """One copy node by ``method`` (one of METHODS), in the destination's context ``kernels.ctx``,
    through the driver that loaded ``kernels``."""
    if method == "memcpy":
        return kernels.driver.add_copy(graph, after, dst, src, length, kernels.ctx)
    if method == "captured":
        return kernels.driver.add_captured_copy(graph, after, dst, src, length)
    if method == "kernel":
        return kernels.copy(graph, after, dst, src, length)
    raise UsageError(f"unknown copy method {method!r}; expected one of {', '.join(METHODS)}")


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)
