"""Capture one step of an unmodified PyTorch model as a kernel program (runs on a GPU).

The step is warmed up (which also compiles any torch.compile / Triton kernels), then captured
once into ``torch.cuda.CUDAGraph(keep_graph=True)`` while an :class:`OpRecorder` — a
TorchDispatchMode — notes, for every ATen op, which graph nodes it created and which tensors
its schema says it read and wrote. The graph is then walked through the driver doorway
(:class:`~kernelfleet.kernels.cuda.driver.CudaDriver`) into a :class:`~kernelfleet.kernels.raw.RawCapture`, with
the allocator's segments, the named weights, inputs and outputs, and the PTX of every Triton
kernel that ran. The :class:`Captured` object keeps the graph, its memory pool and the tensors
alive, so the step can be replayed node by node (``replay.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kernelfleet.flops import op_flops
from kernelfleet.kernels.cuda import triton_ptx
from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver
from kernelfleet.kernels.cuda.replayer import NodeReplayer
from kernelfleet.kernels.raw import RawCapture, RawNode, RawOp, RawTensor, Region


def tensor_record(t: torch.Tensor, mode: str) -> RawTensor | None:
    """The bytes a tensor view spans (first to last element) and its whole storage."""
    if t.numel() == 0 or t.layout != torch.strided:
        return None
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
    storage = t.untyped_storage()
    return RawTensor(t.data_ptr(), span * t.element_size(), storage.data_ptr(), storage.nbytes(), mode)


def op_tensors(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> list[RawTensor]:
    """What an ATen op's schema says it does with each tensor: read, write, or both.

    An argument the schema marks written (``Tensor(a!)``) is read and written — an in-place op
    reads what it overwrites — except an ``out=`` argument, which is only written; returned
    tensors are written. A tensor passed twice gets the union of its modes.
    """
    modes: dict[int, tuple[torch.Tensor, set[str]]] = {}

    def note(value: Any, mode: set[str]) -> None:
        for t in tree_flatten(value)[0]:
            if isinstance(t, torch.Tensor):
                modes.setdefault(id(t), (t, set()))[1].update(mode)

    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        written = arg.alias_info is not None and arg.alias_info.is_write
        note(value, ({"write"} if arg.kwarg_only and arg.name.startswith("out") else {"read", "write"})
             if written else {"read"})
    note(out, {"write"})
    records = []
    for t, mode in modes.values():
        record = tensor_record(t, "readwrite" if mode == {"read", "write"} else mode.pop())
        if record is not None:
            records.append(record)
    return records


class OpRecorder(TorchDispatchMode):
    """Records each ATen op that creates graph nodes: its name, node range and tensors."""

    def __init__(self, count_nodes: Callable[[], int]) -> None:
        super().__init__()
        self.count_nodes = count_nodes
        self.ops: list[RawOp] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.count_nodes()
        out = func(*args, **kwargs)
        after = self.count_nodes()
        if after > before:
            precision, flops = op_flops(func, args, kwargs, out) or (None, 0)
            self.ops.append(RawOp(str(func), before, after, tuple(op_tensors(func, args, kwargs, out)), flops, precision))
        return out


@dataclass
class Captured:
    """A captured step, kept alive: the torch graph, its raw graph and nodes, inputs, outputs."""

    raw: RawCapture
    graph: torch.cuda.CUDAGraph
    handle: Any  # CUgraph
    nodes: list[Any]  # CUgraphNode, creation order (= RawCapture.nodes)
    args: tuple
    outputs: Any
    context: Any  # the CUcontext the graph was captured in
    keep: tuple = ()  # the step and its module: the graph reads their memory, so they must outlive it
    driver: CudaDriver = CUDA  # the one that read the graph: its node handles are that driver's

    def replay(self) -> None:
        self.graph.replay()

    def output_tensors(self) -> list[torch.Tensor]:
        """The step's output tensors (graph replays write them in place)."""
        return [t for t in tree_flatten(self.outputs)[0] if isinstance(t, torch.Tensor)]

    def replayer(self, context: Any = None) -> NodeReplayer:
        """Replays single nodes in ``context`` (a partition's; None: the capture's own)."""
        return NodeReplayer(self.nodes, self.context if context is None else context, self.driver)


def capture(step: Callable[..., Any], args: Sequence[Any], *, module: torch.nn.Module | None = None,
            warmup: int = 2, what: str = "", ptx_dirs: list | None = None, record_ops: bool = True,
            driver: CudaDriver = CUDA, pool: Any = None) -> Captured:
    """Capture ``step(*args)`` on the current CUDA device; ``module`` names the weights.

    ``record_ops=False`` captures without the dispatch mode (for a torch.compile'd step, whose
    guards a mode would disturb): library kernels then have no schema and are pinned. ``driver``
    reads the graph (and is kept with it, to replay its nodes). ``pool``: a graph memory pool
    (``torch.cuda.graph_pool_handle()``) the capture shares with others whose graphs never run at
    the same time (default: a pool of its own).
    """
    args = tuple(args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(warmup):
            step(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    history = _AllocationHistory()
    # A capture stream of this device: torch.cuda.graph's default one is made once, on the device
    # current at its first use, and a later capture on another GPU then fails inside cuBLAS.
    with history, torch.no_grad(), torch.cuda.graph(graph, pool=pool, stream=torch.cuda.Stream()):
        stream = torch.cuda.current_stream().cuda_stream
        recorder = OpRecorder(lambda: driver.capturing_node_count(stream))
        with recorder if record_ops else nullcontext():
            outputs = step(*args)
    handle = driver.graph_handle(graph.raw_cuda_graph())
    nodes = driver.nodes(handle)
    raw_nodes = [_raw_node(n, driver) for n in nodes]
    names = {n.name for n in raw_nodes if n.kind == "kernel"}
    raw = RawCapture(raw_nodes, recorder.ops, _regions(module, args, outputs), _segments(),
                     triton_ptx.index(ptx_dirs or triton_ptx.default_dirs(), names), _about(what),
                     history.allocations)
    return Captured(raw, graph, handle, nodes, args, outputs, driver.current_context(), (step, module), driver)


class _AllocationHistory:
    """Every block the caching allocator hands out during capture, as (address, size).

    Blocks are the real allocation boundaries, and they are known even where no op is seen
    (torch.compile's generated code, an op's internal workspace), so a pointer's buffer ends where
    its allocation ends, not at the next tensor some op happened to name.
    """

    def __init__(self) -> None:
        self.allocations: list[tuple[int, int]] = []

    def __enter__(self) -> _AllocationHistory:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python")
        return self

    def __exit__(self, *exc: object) -> None:
        device = torch.cuda.current_device()
        traces = torch.cuda.memory._snapshot().get("device_traces", [])
        events = traces[device] if device < len(traces) else []
        self.allocations = sorted({(e["addr"], e["size"]) for e in events if e.get("action") == "alloc"})
        torch.cuda.memory._record_memory_history(enabled=None)


def _raw_node(node: Any, driver: CudaDriver) -> RawNode:
    kind = driver.node_kind(node)
    if kind == "kernel":
        k = driver.kernel_node(node)
        return RawNode("kernel", k.name, k.grid, k.block, k.shared_bytes, k.cluster,
                       tuple((p.offset, p.size, p.raw.hex()) for p in k.params))
    if kind in ("memcpy", "memset"):
        c = driver.copy_node(node, kind)
        return RawNode(kind, dst=c.dst, src=c.src, length_bytes=c.length_bytes, value=c.value)
    return RawNode(kind)


def _regions(module: torch.nn.Module | None, args: tuple, outputs: Any) -> list[Region]:
    def region(t: torch.Tensor, role: str, name: str) -> Region:
        storage = t.untyped_storage()
        return Region(storage.data_ptr(), storage.nbytes(), role, name)

    regions = []
    if module is not None:
        regions += [region(p, "weight", name) for name, p in module.named_parameters()]
        # caches and state: mutable, so not weights
        regions += [region(b, "activation", name) for name, b in module.named_buffers()]
    for role, values in (("input", args), ("output", outputs)):
        tensors = [t for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor) and t.is_cuda]
        regions += [region(t, role, f"{role}{i}") for i, t in enumerate(tensors)
                    if t.untyped_storage().nbytes() > 0]
    return regions


def _segments() -> list[tuple[int, int]]:
    device = torch.cuda.current_device()
    return [(s["address"], s["total_size"]) for s in torch.cuda.memory_snapshot() if s.get("device") == device]


def _about(what: str) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"what": what, "device": props.name, "sms": props.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda}
