"""The null driver: :class:`~kernelfleet.kernels.cuda.driver.CudaDriver`'s twin on a CPU, as
tinygrad's null device (STYLE.md). Same methods, no GPU, no cuda-python, no torch: it records the
graphs it is asked to build and returns deterministic handles, so the multi-device control flow
(executor, links, ranks, replayer, partitions) runs in CI and tests read what it would have made.

Handles: a node is its index in :attr:`NullDriver.added`; graphs, executables and modules are
``"graph0"``, ``"exec0"``, ``"module0"``…; a function is its entry name. A node it did not make (a
captured one) reads as its own ``kind`` where it has one (a recorded ``RawNode``), else as a
kernel. Releasing what it does not hold fails as the driver would (``CUDA_ERROR_INVALID_HANDLE``),
and ``refuse`` makes chosen methods fail (``CUDA_ERROR_INVALID_VALUE``), to exercise fallbacks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kernelfleet.kernels.cuda.doorway import DriverError
from kernelfleet.kernels.cuda.green import too_many
from kernelfleet.kernels.cuda.records import CopyNode, KernelNode, Param


@dataclass(frozen=True, slots=True)
class Added:
    """One node the null driver was asked to add to a graph.

    ``kind``: "launch" (a copy of a captured node; ``what`` is that node), "copy" (a memcpy node;
    ``what`` is (dst, src, length)), "captured_copy" (the same as a child graph), or "kernel"
    (``what`` is (function, grid, block, params)). ``after``: the nodes it waits for; ``ctx``: the
    context it runs in (None: the current one)."""

    graph: str
    kind: str
    what: Any
    after: tuple[int, ...]
    ctx: Any


_TYPES = {"copy": "memcpy", "captured_copy": "graph", "kernel": "kernel"}  # a node kind as the driver types it


class NullDriver:
    """A recording driver. ``sms``: SMs of every device (an H200's 132 by default);
    ``priorities``: (lowest, highest) launch priority; ``refuse``: method names that fail."""

    def __init__(self, sms: int = 132, priorities: tuple[int, int] = (0, -5), refuse: tuple[str, ...] = ()) -> None:
        self.sms, self.refuse, self._range = sms, refuse, priorities
        self.context = "context0"  # the current context when no other was pushed
        self.added: list[Added] = []
        self.launched: list[tuple[Any, int]] = []  # (executable or function, stream), in launch order
        self.priorities: dict[int, int] = {}  # node -> launch priority
        self.peers: set[tuple[Any, Any]] = set()  # (ctx, peer) with peer access enabled
        self.live: set[str] = set()  # graphs, executables and modules made and not yet released
        self._made = 0
        self._stack: list[Any] = []

    def _make(self, prefix: str) -> str:
        handle = f"{prefix}{self._made}"
        self._made += 1
        self.live.add(handle)
        return handle

    def _held(self, handle: Any, method: str) -> None:
        """``method`` may run (not refused) on ``handle``, which this driver made and still holds."""
        if method in self.refuse:
            raise DriverError.refused(method, "CUDA_ERROR_INVALID_VALUE")
        if handle is not None and handle not in self.live:
            raise DriverError.refused(f"{method}({handle!r})", "CUDA_ERROR_INVALID_HANDLE")

    def _release(self, handle: str, method: str) -> None:
        self._held(handle, method)
        self.live.remove(handle)

    def _add(self, graph: str, kind: str, what: Any, after: list[Any], ctx: Any) -> int:
        self._held(graph, "add_copy_of" if kind == "launch" else f"add_{kind}")
        self.added.append(Added(graph, kind, what, tuple(after), ctx))
        return len(self.added) - 1

    def _captured(self, node: Any) -> Any:
        """The captured node behind ``node`` (itself when it is not one of ours)."""
        while isinstance(node, int) and 0 <= node < len(self.added) and self.added[node].kind == "launch":
            node = self.added[node].what
        return node

    # reading a graph

    def graph_handle(self, raw: int) -> Any:
        return raw

    def capturing_node_count(self, stream: int) -> int:
        return 0  # the null driver never captures

    def nodes(self, graph: Any) -> list[Any]:
        return [i for i, a in enumerate(self.added) if a.graph == graph]

    def edges(self, graph: Any) -> list[tuple[int, int]]:
        return [(d, i) for i, a in enumerate(self.added) if a.graph == graph for d in a.after]

    def node_kind(self, node: Any) -> str:
        node = self._captured(node)
        if isinstance(node, int) and 0 <= node < len(self.added):
            return _TYPES[self.added[node].kind]
        return getattr(node, "kind", "kernel")

    def kernel_node(self, node: Any) -> KernelNode:
        node = self._captured(node)
        if isinstance(node, int) and 0 <= node < len(self.added) and self.added[node].kind == "kernel":
            function, grid, block, params = self.added[node].what
            offsets = [sum(len(p) for p in params[:i]) for i in range(len(params))]
            return KernelNode(function, grid, block, 0, tuple(Param(o, len(p), p) for o, p in zip(offsets, params)), None)
        if getattr(node, "kind", None) == "kernel":  # a recorded RawNode
            return KernelNode(node.name, node.grid, node.block, node.shared_bytes,
                              tuple(Param(o, s, bytes.fromhex(h)) for o, s, h in node.params), node.cluster)
        raise DriverError.refused(f"kernel_node({node!r})", "CUDA_ERROR_INVALID_VALUE")

    def copy_node(self, node: Any, kind: str) -> CopyNode:
        node = self._captured(node)
        if isinstance(node, int) and 0 <= node < len(self.added) and self.added[node].kind == "copy":
            dst, src, length = self.added[node].what
            return CopyNode("memcpy", dst, length, src=src)
        if getattr(node, "kind", None) == kind:  # a recorded RawNode
            return CopyNode(kind, node.dst, node.length_bytes, src=node.src, value=node.value)
        raise DriverError.refused(f"copy_node({node!r}, {kind!r})", "CUDA_ERROR_INVALID_VALUE")

    # building and running graphs

    def create_graph(self) -> Any:
        return self._make("graph")

    def add_copy_of(self, graph: Any, node: Any, after: list[Any], ctx: Any) -> Any:
        kind = self.node_kind(node)
        if kind not in ("kernel", "memcpy", "memset"):
            raise DriverError(f"cannot replay a graph node of type {kind}: capture the step without it")
        return self._add(graph, "launch", node, after, ctx)

    def add_copy(self, graph: Any, after: list[Any], dst: int, src: int, length: int, ctx: Any) -> Any:
        return self._add(graph, "copy", (dst, src, length), after, ctx)

    def add_captured_copy(self, graph: Any, after: list[Any], dst: int, src: int, length: int) -> Any:
        return self._add(graph, "captured_copy", (dst, src, length), after, None)

    def add_kernel(self, graph: Any, after: list[Any], function: Any, grid: tuple[int, int, int],
                   block: tuple[int, int, int], params: list[bytes], ctx: Any) -> Any:
        return self._add(graph, "kernel", (function, grid, block, tuple(params)), after, ctx)

    def priority_range(self) -> tuple[int, int]:
        return self._range

    def set_priority(self, node: Any, priority: int) -> None:
        self.priorities[node] = priority

    def instantiate(self, graph: Any) -> Any:
        self._held(graph, "instantiate")
        return self._make("exec")

    def launch(self, executable: Any, stream: int) -> None:
        self._held(executable, "launch")
        self.launched.append((executable, stream))

    def destroy(self, graph: Any, executable: Any = None) -> None:
        if executable is not None:
            self._release(executable, "destroy")
        self._release(graph, "destroy")

    # partitions

    def green_streams(self, device: int, sm_counts: list[int], granule: int = 8,
                      first_group: int = 0) -> list[tuple[Any, int, int]]:
        self._held(None, "green_streams")
        groups, out, taken = self.sms // granule, [], first_group
        for k, sms in enumerate(sm_counts):
            need = -(-sms // granule)
            if taken + need > groups:
                raise DriverError(too_many(sm_counts, groups - first_group, granule))
            out.append((f"green{device}.{taken}", 0x1000 * (device + 1) + taken, need * granule))
            taken += need
        return out

    # contexts, modules, single launches

    def current_context(self) -> Any:
        return self._stack[-1] if self._stack else self.context

    @contextmanager
    def in_context(self, ctx: Any) -> Iterator[None]:
        self._stack.append(ctx)
        try:
            yield
        finally:
            self._stack.pop()

    def pointer_device(self, address: int) -> int:
        return 0  # one device holds all memory the null driver is asked about

    def enable_peer_access(self, ctx: Any, peer: Any) -> None:
        self._held(None, "enable_peer_access")
        self.peers.add((ctx, peer))

    def load_module(self, ptx: str, entries: list[str], ctx: Any) -> tuple[Any, dict[str, Any]]:
        self._held(None, "load_module")
        return self._make("module"), {e: e for e in entries}

    def unload_module(self, module: Any) -> None:
        self._release(module, "unload_module")

    def launch_function(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                        shared_bytes: int, params: list[bytes], stream: int) -> None:
        self._held(None, "launch_function")
        self.launched.append((function, stream))

    def load_and_launch(self, ptx: str, entry: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                        shared_bytes: int, params: list[bytes], stream: int) -> None:
        module, functions = self.load_module(ptx, [entry], self.current_context())
        try:
            self.launch_function(functions[entry], grid, block, shared_bytes, params, stream)
        finally:
            self.unload_module(module)
