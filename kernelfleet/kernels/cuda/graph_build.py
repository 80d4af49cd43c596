"""Building, launching and releasing CUDA graphs through the driver: copies of captured nodes,
copy nodes between devices, kernel nodes of loaded modules, launch priorities."""

from __future__ import annotations

import ctypes
from typing import Any

from kernelfleet.kernels.cuda._marshal import kernel_params
from kernelfleet.kernels.cuda.doorway import Doorways, DriverError


class GraphBuilding(Doorways):
    """The driver's graph-building methods (part of :class:`~kernelfleet.kernels.cuda.driver.CudaDriver`).
    A node is added after the nodes ``after`` (handles this driver returned)."""

    def create_graph(self) -> Any:
        return self.call("cuGraphCreate", 0)

    def add_copy_of(self, graph: Any, node: Any, after: list[Any], ctx: Any) -> Any:
        """Add to ``graph`` a node doing what ``node`` (of a captured graph) does, in context ``ctx``:
        same kernel, launch shape, parameters and cluster shape."""
        kind = self.node_kind(node)
        if kind == "memcpy":
            return self.call("cuGraphAddMemcpyNode", graph, after, len(after),
                             self.call("cuGraphMemcpyNodeGetParams", node), ctx)
        if kind == "memset":
            return self.call("cuGraphAddMemsetNode", graph, after, len(after),
                             self.call("cuGraphMemsetNodeGetParams", node), ctx)
        if kind != "kernel":
            raise DriverError(f"cannot replay a graph node of type {kind}: capture the step without it")
        params = self.call("cuGraphKernelNodeGetParams", node)
        params.ctx = ctx
        self._allow_shared_bytes(params.func, int(params.sharedMemBytes))
        new = self.call("cuGraphAddKernelNode", graph, after, len(after), params)
        cluster_id = self.cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        try:
            cluster = self.call("cuGraphKernelNodeGetAttribute", node, cluster_id)
        except DriverError:
            return new
        if int(cluster.clusterDim.x) > 0:
            self.call("cuGraphKernelNodeSetAttribute", new, cluster_id, cluster)
        return new

    def _allow_shared_bytes(self, function: Any, need: int) -> None:
        """Let ``function`` launch with ``need`` bytes of dynamic shared memory where its limit is
        lower: the driver refuses a node asking more (CUDA_ERROR_INVALID_VALUE). A library may set
        a kernel's limit before each launch to what that launch needs: on an H100 (2026-12-06)
        cuDNN's ``lean_reduction_kernel``, captured for batch 1 with 4,160 bytes, had the limit at
        2,080 (what batch 8's launch needs) when the server built its plan graphs."""
        limit = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if need and int(function) and int(self.call("cuFuncGetAttribute", limit, function)) < need:
            self.call("cuFuncSetAttribute", function, limit, need)

    def add_copy(self, graph: Any, after: list[Any], dst: int, src: int, length: int, ctx: Any) -> Any:
        """Add a device-to-device memcpy node of ``length`` bytes (a peer copy when the devices differ)."""
        p = self.cu.CUDA_MEMCPY3D()
        # Unified addressing: the driver finds each pointer's device (a DEVICE-typed copy node given a
        # context was refused on the H200 with CUDA_ERROR_INVALID_VALUE).
        p.srcMemoryType = p.dstMemoryType = self.cu.CUmemorytype.CU_MEMORYTYPE_UNIFIED
        p.srcDevice, p.dstDevice = src, dst
        p.WidthInBytes, p.Height, p.Depth = length, 1, 1
        return self.call("cuGraphAddMemcpyNode", graph, after, len(after), p, ctx)

    def add_captured_copy(self, graph: Any, after: list[Any], dst: int, src: int, length: int) -> Any:
        """A child-graph node holding the copy node stream capture makes for ``cuMemcpyAsync``."""
        cu = self.cu
        stream = self.call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
        try:
            self.call("cuStreamBeginCapture", stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
            self.call("cuMemcpyAsync", dst, src, length, stream)
            child = self.call("cuStreamEndCapture", stream)
        finally:
            self.call("cuStreamDestroy", stream)
        try:
            return self.call("cuGraphAddChildGraphNode", graph, after, len(after), child)  # the node clones it
        finally:
            self.call("cuGraphDestroy", child)

    def add_kernel(self, graph: Any, after: list[Any], function: Any, grid: tuple[int, int, int],
                   block: tuple[int, int, int], params: list[bytes], ctx: Any) -> Any:
        """Add a kernel node launching ``function`` (of :meth:`load_module`) with raw parameter
        values ``params``, in context ``ctx``."""
        _alive, slots = kernel_params(params)  # the driver copies the values while making the node
        p = self.cu.CUDA_KERNEL_NODE_PARAMS()
        p.func, p.ctx = function, ctx
        p.gridDimX, p.gridDimY, p.gridDimZ = grid
        p.blockDimX, p.blockDimY, p.blockDimZ = block
        p.sharedMemBytes = 0
        p.kernelParams = ctypes.addressof(slots)
        return self.call("cuGraphAddKernelNode", graph, after, len(after), p)

    def priority_range(self) -> tuple[int, int]:
        """(lowest, highest) launch priority of the current context; a larger number is lower."""
        least, greatest = self.call("cuCtxGetStreamPriorityRange")
        return int(least), int(greatest)

    def set_priority(self, node: Any, priority: int) -> None:
        """Give a kernel node a launch priority (its blocks go first when SMs free up)."""
        value = self.cu.CUkernelNodeAttrValue()
        value.priority = priority
        self.call("cuGraphKernelNodeSetAttribute", node, self.cu.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY, value)

    def instantiate(self, graph: Any) -> Any:
        """The graph's executable (what :meth:`launch` runs)."""
        return self.call("cuGraphInstantiate", graph, 0)

    def launch(self, executable: Any, stream: int) -> None:
        """Launch an instantiated graph on ``stream`` (a raw stream handle), asynchronously."""
        self.call("cuGraphLaunch", executable, self.cu.CUstream(stream))

    def destroy(self, graph: Any, executable: Any = None) -> None:
        """Release a graph and its executable (None: a graph never instantiated)."""
        if executable is not None:
            self.call("cuGraphExecDestroy", executable)
        self.call("cuGraphDestroy", graph)
