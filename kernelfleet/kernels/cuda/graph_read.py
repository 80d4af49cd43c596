"""Reading a captured CUDA graph through the driver: its nodes, edges, and what each node does."""

from __future__ import annotations

from typing import Any

from kernelfleet.kernels.cuda._marshal import extra_buffer, kernel_param_bytes
from kernelfleet.kernels.cuda.doorway import Doorways, DriverError
from kernelfleet.kernels.cuda.records import CopyNode, KernelNode, Param


class GraphReading(Doorways):
    """The driver's graph-reading methods (part of :class:`~kernelfleet.kernels.cuda.driver.CudaDriver`)."""

    def graph_handle(self, raw: int) -> Any:
        """A ``CUgraph`` for the raw handle torch gives (``CUDAGraph.raw_cuda_graph()``)."""
        return self.cu.CUgraph(raw)

    def capturing_node_count(self, stream: int) -> int:
        """Nodes so far in the graph that ``stream`` is capturing into."""
        info = self.call("cuStreamGetCaptureInfo", self.cu.CUstream(stream))
        graph = info[2]  # (status, id, graph, dependencies, [edge data,] count)
        return int(self.call("cuGraphGetNodes", graph, 0)[1])

    def nodes(self, graph: Any) -> list[Any]:
        """The graph's nodes in creation order (stream capture adds them in launch order)."""
        count = int(self.call("cuGraphGetNodes", graph, 0)[1])
        return list(self.call("cuGraphGetNodes", graph, count)[0]) if count else []

    def edges(self, graph: Any) -> list[tuple[int, int]]:
        """Dependencies as (from, to) raw node handles."""
        count = int(self.call("cuGraphGetEdges", graph, 0)[-1])
        if not count:
            return []
        result = self.call("cuGraphGetEdges", graph, count)
        return [(int(a), int(b)) for a, b in zip(result[0], result[1])]

    def node_kind(self, node: Any) -> str:
        """"kernel", "memcpy", "memset", or the driver's own type name in lower case (e.g. "graph")."""
        types = self.cu.CUgraphNodeType
        kind = self.call("cuGraphNodeGetType", node)
        return {types.CU_GRAPH_NODE_TYPE_KERNEL: "kernel",
                types.CU_GRAPH_NODE_TYPE_MEMCPY: "memcpy",
                types.CU_GRAPH_NODE_TYPE_MEMSET: "memset"}.get(kind, kind.name.removeprefix("CU_GRAPH_NODE_TYPE_").lower())

    def kernel_node(self, node: Any) -> KernelNode:
        """Name, launch shape and raw parameter bytes of a kernel node."""
        p = self.call("cuGraphKernelNodeGetParams", node)
        if int(p.func):
            name, info, handle = "cuFuncGetName", "cuFuncGetParamInfo", p.func
        else:  # a context-independent CUkernel (cuLibrary)
            name, info, handle = "cuKernelGetName", "cuKernelGetParamInfo", p.kern
        raw_name = self.call(name, handle)
        layout = []
        while True:
            try:
                offset, size = self.call(info, handle, len(layout))
            except DriverError:  # CUDA_ERROR_INVALID_VALUE past the last parameter
                break
            layout.append((int(offset), int(size)))
        params = []
        if layout and int(p.kernelParams):
            params = [Param(offset, size, raw) for (offset, size), raw
                      in zip(layout, kernel_param_bytes(int(p.kernelParams), layout))]
        elif int(p.extra):  # cuBLAS packs its arguments into one buffer passed through `extra`
            blob = extra_buffer(int(p.extra))
            if layout and layout[-1][0] + layout[-1][1] <= len(blob):
                params = [Param(offset, size, blob[offset:offset + size]) for offset, size in layout]
            elif blob:
                params = [Param(0, len(blob), blob)]
        return KernelNode(raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name),
                          (p.gridDimX, p.gridDimY, p.gridDimZ), (p.blockDimX, p.blockDimY, p.blockDimZ),
                          int(p.sharedMemBytes), tuple(params), self._cluster(node))

    def _cluster(self, node: Any) -> tuple[int, int, int] | None:
        """A kernel node's thread-block cluster shape; None for none (0s or 1s) or when unreadable."""
        try:
            value = self.call("cuGraphKernelNodeGetAttribute", node,
                              self.cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        except DriverError:
            return None
        cluster = (int(value.clusterDim.x), int(value.clusterDim.y), int(value.clusterDim.z))
        return cluster if cluster != (0, 0, 0) and cluster != (1, 1, 1) else None

    def copy_node(self, node: Any, kind: str) -> CopyNode:
        """Where a memcpy or memset node (``kind``) writes, how many bytes, and from what."""
        if kind == "memset":
            p = self.call("cuGraphMemsetNodeGetParams", node)
            return CopyNode("memset", int(p.dst), int(p.width) * int(p.elementSize) * max(1, int(p.height)),
                            value=int(p.value))
        p = self.call("cuGraphMemcpyNodeGetParams", node)
        length = int(p.WidthInBytes) * max(1, int(p.Height)) * max(1, int(p.Depth))
        device = self.cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        src = int(p.srcDevice) + int(p.srcXInBytes) if p.srcMemoryType == device else None
        return CopyNode("memcpy", int(p.dstDevice) + int(p.dstXInBytes), length, src=src)
