"""The one doorway to the CUDA driver (STYLE.md, rule 2), through ``cuda.bindings.driver``.

Every driver call in kernelfleet goes through :func:`call`, which turns a ``CUresult`` into a
:class:`DriverError` naming the function and the driver's own error name. The functions below
read a captured CUDA graph as plain records (:class:`KernelNode`, :class:`CopyNode`) and build
small graphs that replay chosen nodes — the only code of the place half that talks to the driver.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import EnvironmentProblem, KernelfleetError


class DriverError(KernelfleetError):
    """A CUDA driver call failed."""


def _cu() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - part of the [place] extra
        raise EnvironmentProblem(f"cuda-python is missing ({exc}); pip install 'kernelfleet[place]'") from exc
    return driver


def call(function: str, *args: Any, also_fine: tuple[str, ...] = ()) -> Any:
    """``cuda.bindings.driver.<function>(*args)``; its results without the status (one → bare).
    ``also_fine``: error names that mean the call has nothing to do (e.g. already enabled)."""
    cu = _cu()
    result = getattr(cu, function)(*args)
    status, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if status != cu.CUresult.CUDA_SUCCESS and status.name not in also_fine:
        _, name = cu.cuGetErrorName(status)
        raise DriverError(f"{function} failed: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else rest


@dataclass(frozen=True, slots=True)
class Param:
    offset: int
    size: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class KernelNode:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    params: tuple[Param, ...]
    cluster: tuple[int, int, int] | None


@dataclass(frozen=True, slots=True)
class CopyNode:
    kind: str  # "memcpy" | "memset"
    dst: int
    length_bytes: int
    src: int | None = None  # memcpy only (device to device); None when the source is host memory
    value: int | None = None  # memset only


def current_context() -> Any:
    return call("cuCtxGetCurrent")


def pointer_device(address: int) -> int:
    """The ordinal of the GPU that holds device memory at ``address``.

    Asked of the runtime (``cudaPointerGetAttributes``, as torch asks): cuda-python's driver binding
    reads ``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`` back from a field the driver never wrote and
    answers 0 for every GPU (NVIDIA/cuda-python#2928). On two H200s that put the saved state of
    GPU 1's captures on GPU 0, 11 GB per 8B-decode slot.
    """
    from cuda.bindings import runtime

    status, attributes = runtime.cudaPointerGetAttributes(address)
    if status != runtime.cudaError_t.cudaSuccess:
        raise DriverError(f"cudaPointerGetAttributes failed: {status.name}")
    return int(attributes.device)


@contextmanager
def in_context(ctx: Any) -> Iterator[None]:
    """Make ``ctx`` current on this thread for the block (nodes added to a graph run in the context
    current when they were added: a green context's, to run on its partition)."""
    call("cuCtxPushCurrent", ctx)
    try:
        yield
    finally:
        call("cuCtxPopCurrent")


def priority_range() -> tuple[int, int]:
    """(lowest, highest) launch priority of the current context; a larger number is lower."""
    least, greatest = call("cuCtxGetStreamPriorityRange")
    return int(least), int(greatest)


def set_priority(node: Any, priority: int) -> None:
    """Give a kernel node a launch priority (its blocks go first when SMs free up)."""
    cu = _cu()
    value = cu.CUkernelNodeAttrValue()
    value.priority = priority
    call("cuGraphKernelNodeSetAttribute", node, cu.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY, value)


def graph_handle(raw: int) -> Any:
    return _cu().CUgraph(raw)


def stream_handle(raw: int) -> Any:
    return _cu().CUstream(raw)


def capturing_node_count(stream: int) -> int:
    """Nodes so far in the graph that ``stream`` is capturing into."""
    info = call("cuStreamGetCaptureInfo", stream_handle(stream))
    graph = info[2]  # (status, id, graph, dependencies, [edge data,] count)
    return int(call("cuGraphGetNodes", graph, 0)[1])


def nodes(graph: Any) -> list[Any]:
    """The graph's nodes in creation order (stream capture adds them in launch order)."""
    count = int(call("cuGraphGetNodes", graph, 0)[1])
    return list(call("cuGraphGetNodes", graph, count)[0]) if count else []


def edges(graph: Any) -> list[tuple[int, int]]:
    """Dependencies as (from, to) raw node handles."""
    count = int(call("cuGraphGetEdges", graph, 0)[-1])
    if not count:
        return []
    result = call("cuGraphGetEdges", graph, count)
    return [(int(a), int(b)) for a, b in zip(result[0], result[1])]


def node_kind(node: Any) -> str:
    cu = _cu()
    kind = call("cuGraphNodeGetType", node)
    return {cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL: "kernel",
            cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY: "memcpy",
            cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET: "memset"}.get(kind, kind.name.removeprefix("CU_GRAPH_NODE_TYPE_").lower())


def kernel_node(node: Any) -> KernelNode:
    """Name, launch shape and raw parameter bytes of a kernel node."""
    cu = _cu()
    p = call("cuGraphKernelNodeGetParams", node)
    if int(p.func):
        name, info, handle = "cuFuncGetName", "cuFuncGetParamInfo", p.func
    else:  # a context-independent CUkernel (cuLibrary)
        name, info, handle = "cuKernelGetName", "cuKernelGetParamInfo", p.kern
    raw_name = call(name, handle)
    layout = []
    while True:
        try:
            offset, size = call(info, handle, len(layout))
        except DriverError:  # CUDA_ERROR_INVALID_VALUE past the last parameter
            break
        layout.append((int(offset), int(size)))
    params = []
    if layout and int(p.kernelParams):
        slots = ctypes.cast(int(p.kernelParams), ctypes.POINTER(ctypes.c_void_p))
        params = [Param(offset, size, ctypes.string_at(slots[i], size)) for i, (offset, size) in enumerate(layout)]
    elif int(p.extra):  # cuBLAS packs its arguments into one buffer passed through `extra`
        blob = _extra_buffer(int(p.extra))
        if layout and layout[-1][0] + layout[-1][1] <= len(blob):
            params = [Param(offset, size, blob[offset:offset + size]) for offset, size in layout]
        elif blob:
            params = [Param(0, len(blob), blob)]
    try:
        value = call("cuGraphKernelNodeGetAttribute", node,
                     cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        cluster = (int(value.clusterDim.x), int(value.clusterDim.y), int(value.clusterDim.z))
        cluster = cluster if cluster != (0, 0, 0) and cluster != (1, 1, 1) else None
    except DriverError:
        cluster = None
    return KernelNode(raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name),
                      (p.gridDimX, p.gridDimY, p.gridDimZ), (p.blockDimX, p.blockDimY, p.blockDimZ),
                      int(p.sharedMemBytes), tuple(params), cluster)


def _extra_buffer(address: int) -> bytes:
    """The argument buffer of a launch's ``extra`` list: (key, value) pairs ending in END (0), where
    key 1 (CU_LAUNCH_PARAM_BUFFER_POINTER) gives the buffer and key 2 a pointer to its size."""
    slots = ctypes.cast(address, ctypes.POINTER(ctypes.c_void_p))
    pointer = size = None
    for i in range(0, 16, 2):
        key = slots[i] or 0
        if key == 0:
            break
        if key == 1:
            pointer = slots[i + 1]
        elif key == 2:
            size = ctypes.cast(slots[i + 1], ctypes.POINTER(ctypes.c_size_t))[0]
    return ctypes.string_at(pointer, size) if pointer and size else b""


def copy_node(node: Any, kind: str) -> CopyNode:
    cu = _cu()
    if kind == "memset":
        p = call("cuGraphMemsetNodeGetParams", node)
        return CopyNode("memset", int(p.dst), int(p.width) * int(p.elementSize) * max(1, int(p.height)),
                        value=int(p.value))
    p = call("cuGraphMemcpyNodeGetParams", node)
    length = int(p.WidthInBytes) * max(1, int(p.Height)) * max(1, int(p.Depth))
    device = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    src = int(p.srcDevice) + int(p.srcXInBytes) if p.srcMemoryType == device else None
    return CopyNode("memcpy", int(p.dstDevice) + int(p.dstXInBytes), length, src=src)


class NodeReplayer:
    """Replays single nodes of a captured graph, alone or repeated, on a chosen stream.

    ``one(i)`` runs node ``i`` by itself (so a step can be replayed node by node with its real
    state), ``repeated(i, n)`` runs ``n`` copies of it back to back (timing without the launch
    overhead of a graph per kernel). Both launch a small graph holding copies of the node, built
    in the capture's context. (Toggling nodes of one instantiation of the whole graph with
    ``cuGraphNodeSetEnabled`` faulted on the H200 for graphs of ~2,000 nodes; small graphs did
    not.) Every handle is released by ``close``.
    """

    def __init__(self, graph_nodes: list[Any], context: Any) -> None:
        """``context``: where the small graphs are built and so run — the capture's context, or a
        green context's, to run the nodes on that partition's SMs."""
        self.nodes, self.context = graph_nodes, context
        self._graphs: dict[tuple[int, int, tuple[int, ...]], tuple[Any, Any]] = {}

    def one(self, index: int, stream: int, prelude: tuple[int, ...] = ()) -> None:
        self.repeated(index, 1, stream, prelude)

    def repeated(self, index: int, count: int, stream: int, prelude: tuple[int, ...] = ()) -> None:
        """``count`` copies of node ``index``, each after copies of the nodes ``prelude`` (the
        memsets that reset its state, ``replay.preludes``)."""
        key = (index, count, prelude)
        if key not in self._graphs:  # built in the capture's context, whatever stream it then runs on
            with in_context(self.context):
                self._graphs[key] = _repeat_graph([self.nodes[i] for i in (*prelude, index)], count, self.context)
        launch(self._graphs[key][1], stream)

    def close(self) -> None:
        for graph, exe in self._graphs.values():
            destroy(graph, exe)
        self._graphs.clear()


def _repeat_graph(nodes: list[Any], count: int, ctx: Any) -> tuple[Any, Any]:
    """A graph of ``count`` copies of the sequence ``nodes`` in one chain, in context ``ctx``, and
    its instantiation."""
    graph = create_graph()
    previous: list[Any] = []
    for _ in range(count):
        for node in nodes:
            previous = [add_copy_of(graph, node, previous, ctx)]
    return graph, instantiate(graph)


def add_copy_of(graph: Any, node: Any, after: list[Any], ctx: Any) -> Any:
    """Add to ``graph`` a node doing what ``node`` (of a captured graph) does, in context ``ctx``,
    after the nodes ``after``: same kernel, launch shape, parameters and cluster shape."""
    cu = _cu()
    kind = node_kind(node)
    if kind == "memcpy":
        return call("cuGraphAddMemcpyNode", graph, after, len(after), call("cuGraphMemcpyNodeGetParams", node), ctx)
    if kind == "memset":
        return call("cuGraphAddMemsetNode", graph, after, len(after), call("cuGraphMemsetNodeGetParams", node), ctx)
    if kind != "kernel":
        raise DriverError(f"cannot replay a graph node of type {kind}")
    params = call("cuGraphKernelNodeGetParams", node)
    params.ctx = ctx
    new = call("cuGraphAddKernelNode", graph, after, len(after), params)
    cluster_id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    try:
        cluster = call("cuGraphKernelNodeGetAttribute", node, cluster_id)
    except DriverError:
        return new
    if int(cluster.clusterDim.x) > 0:
        call("cuGraphKernelNodeSetAttribute", new, cluster_id, cluster)
    return new


def add_copy(graph: Any, after: list[Any], dst: int, src: int, length: int, ctx: Any) -> Any:
    """Add a device-to-device memcpy node of ``length`` bytes (a peer copy when the devices differ)."""
    cu = _cu()
    p = cu.CUDA_MEMCPY3D()
    # Unified addressing: the driver finds each pointer's device (a DEVICE-typed copy node given a
    # context was refused on the H200 with CUDA_ERROR_INVALID_VALUE).
    p.srcMemoryType = p.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_UNIFIED
    p.srcDevice, p.dstDevice = src, dst
    p.WidthInBytes, p.Height, p.Depth = length, 1, 1
    return call("cuGraphAddMemcpyNode", graph, after, len(after), p, ctx)


def add_captured_copy(graph: Any, after: list[Any], dst: int, src: int, length: int) -> Any:
    """A child-graph node holding the copy node stream capture makes for ``cuMemcpyAsync``."""
    cu = _cu()
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    try:
        call("cuStreamBeginCapture", stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        call("cuMemcpyAsync", dst, src, length, stream)
        child = call("cuStreamEndCapture", stream)
    finally:
        call("cuStreamDestroy", stream)
    try:
        return call("cuGraphAddChildGraphNode", graph, after, len(after), child)  # the node clones it
    finally:
        call("cuGraphDestroy", child)


def load_module(ptx: str, entries: list[str], ctx: Any) -> tuple[Any, dict[str, Any]]:
    """Load a PTX module in context ``ctx``: (module, {entry: function}) for the named entries."""
    with in_context(ctx):
        module = call("cuModuleLoadData", ptx.encode() + b"\0")
        return module, {name: call("cuModuleGetFunction", module, name.encode()) for name in entries}


def enable_peer_access(ctx: Any, peer: Any) -> None:
    """Let kernels of context ``ctx`` read and write memory of context ``peer`` (another GPU's)."""
    with in_context(ctx):
        call("cuCtxEnablePeerAccess", peer, 0, also_fine=("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",))


def unload_module(module: Any) -> None:
    call("cuModuleUnload", module)


def add_kernel(graph: Any, after: list[Any], function: Any, grid: tuple[int, int, int],
               block: tuple[int, int, int], params: list[bytes], ctx: Any) -> Any:
    """Add a kernel node launching ``function`` with raw parameter values ``params`` (copied by the
    driver when the node is made), in context ``ctx``."""
    cu = _cu()
    values, slots = _kernel_params(params)  # the driver copies them while making the node
    p = cu.CUDA_KERNEL_NODE_PARAMS()
    p.func, p.ctx = function, ctx
    p.gridDimX, p.gridDimY, p.gridDimZ = grid
    p.blockDimX, p.blockDimY, p.blockDimZ = block
    p.sharedMemBytes = 0
    p.kernelParams = ctypes.addressof(slots)
    return call("cuGraphAddKernelNode", graph, after, len(after), p)


def create_graph() -> Any:
    return call("cuGraphCreate", 0)


def instantiate(graph: Any) -> Any:
    return call("cuGraphInstantiate", graph, 0)


def launch(executable: Any, stream: int) -> None:
    call("cuGraphLaunch", executable, stream_handle(stream))


def destroy(graph: Any, executable: Any) -> None:
    call("cuGraphExecDestroy", executable)
    call("cuGraphDestroy", graph)


def green_streams(device: int, sm_counts: list[int], granule: int = 8) -> list[tuple[Any, int, int]]:
    """Disjoint SM partitions of ``device`` with a stream each: [(context, stream, SMs)], the
    context being the green context as a ``CUcontext`` (what graphs for the partition are built in).

    The device's SMs are split once into groups of ``granule`` SMs and each partition takes the
    next groups in turn, so partitions never share an SM (two splits of the whole device would
    both start at SM 0, and the driver refuses to split a split's remainder). Kernels launched on a
    partition's stream run on its SMs only; a graph does so only if it was built in the
    partition's context (a graph keeps the context it was made in, whatever stream launches it).
    """
    cu = _cu()
    dev = call("cuDeviceGet", device)
    whole = call("cuDeviceGetDevResource", dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
    groups, count, _ = call("cuDevSmResourceSplitByCount", int(whole.sm.smCount) // granule, whole, 0, granule)
    groups = list(groups)[:int(count)]
    out, taken = [], 0
    for sms in sm_counts:
        need = -(-sms // granule)
        if taken + need > len(groups):
            raise DriverError(f"cannot carve {sm_counts} SMs from {len(groups)} groups of {granule}")
        mine = groups[taken:taken + need]
        taken += need
        desc = call("cuDevResourceGenerateDesc", mine, len(mine))
        context = call("cuGreenCtxCreate", desc, dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM)
        stream = call("cuGreenCtxStreamCreate", context, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0)
        out.append((call("cuCtxFromGreenCtx", context), int(stream), sum(int(g.sm.smCount) for g in mine)))
    return out


def load_and_launch(ptx: str, entry: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                    shared_bytes: int, params: list[bytes], stream: int) -> None:
    """Load a PTX module, launch ``entry`` once with the given raw parameter values, unload it."""
    cu = _cu()
    module, functions = load_module(ptx, [entry], current_context())
    try:
        function = functions[entry]
        if shared_bytes > 48 * 1024:
            call("cuFuncSetAttribute", function,
                 cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
        launch_function(function, grid, block, shared_bytes, params, stream)
        call("cuStreamSynchronize", stream_handle(stream))
    finally:
        unload_module(module)


def launch_function(function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int,
                    params: list[bytes], stream: int) -> None:
    """Launch a loaded kernel once on ``stream`` with the given raw parameter values (asynchronous)."""
    values, slots = _kernel_params(params)
    call("cuLaunchKernel", function, *grid, *block, shared_bytes, stream_handle(stream), ctypes.addressof(slots), 0)


def _kernel_params(params: list[bytes]) -> tuple[list[Any], Any]:
    """Raw parameter values as the driver's ``void**`` array: (the value buffers, the array); the
    caller keeps both alive until the driver has read them."""
    values = [ctypes.create_string_buffer(value, len(value)) for value in params]
    return values, (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
