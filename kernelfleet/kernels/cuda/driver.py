"""The CUDA driver as one object (STYLE.md, rule 3: passed in as ``driver=``, this the default).

:class:`CudaDriver` is everything the place half asks of the driver: reading a captured graph
(``graph_read.py``), building and launching graphs (``graph_build.py``), green-context partitions
(``green.py``), and, here, contexts, modules and single launches. Every call goes through one
doorway per API (``doorway.py``), which names the remedy when the driver refuses. Its twin,
``null.py``'s :class:`~kernelfleet.kernels.cuda.null.NullDriver`, has the same methods and runs
the same control flow on a CPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kernelfleet.kernels.cuda._marshal import kernel_params
from kernelfleet.kernels.cuda.graph_build import GraphBuilding
from kernelfleet.kernels.cuda.graph_read import GraphReading
from kernelfleet.kernels.cuda.green import GreenContexts


class CudaDriver(GraphReading, GraphBuilding, GreenContexts):
    """The real driver, through ``cuda.bindings`` (``bindings`` / ``runtime_bindings``: the driver
    and runtime modules to call, None for the real ones, imported at the first call)."""

    def current_context(self) -> Any:
        return self.call("cuCtxGetCurrent")

    @contextmanager
    def in_context(self, ctx: Any) -> Iterator[None]:
        """Make ``ctx`` current on this thread for the block (nodes added to a graph run in the context
        current when they were added: a green context's, to run on its partition)."""
        self.call("cuCtxPushCurrent", ctx)
        try:
            yield
        finally:
            self.call("cuCtxPopCurrent")

    def pointer_device(self, address: int) -> int:
        """The ordinal of the GPU that holds device memory at ``address``.

        Asked of the runtime (``cudaPointerGetAttributes``, as torch asks): cuda-python's driver binding
        reads ``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`` back from a field the driver never wrote and
        answers 0 for every GPU (NVIDIA/cuda-python#2928). On two H200s that put the saved state of
        GPU 1's captures on GPU 0, 11 GB per 8B-decode slot.
        """
        return int(self.runtime("cudaPointerGetAttributes", address).device)

    def enable_peer_access(self, ctx: Any, peer: Any) -> None:
        """Let kernels of context ``ctx`` read and write memory of context ``peer`` (another GPU's)."""
        with self.in_context(ctx):
            self.call("cuCtxEnablePeerAccess", peer, 0, also_fine=("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",))

    def load_module(self, ptx: str, entries: list[str], ctx: Any) -> tuple[Any, dict[str, Any]]:
        """Load a PTX module in context ``ctx``: (module, {entry: function}) for the named entries."""
        with self.in_context(ctx):
            module = self.call("cuModuleLoadData", ptx.encode() + b"\0")
            return module, {name: self.call("cuModuleGetFunction", module, name.encode()) for name in entries}

    def unload_module(self, module: Any) -> None:
        self.call("cuModuleUnload", module)

    def launch_function(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                        shared_bytes: int, params: list[bytes], stream: int) -> None:
        """Launch a loaded kernel once on ``stream`` with the given raw parameter values (asynchronous)."""
        _alive, slots = kernel_params(params)  # the values, kept until the driver has read them in the call
        self.call("cuLaunchKernel", function, *grid, *block, shared_bytes, self.cu.CUstream(stream),
                  ctypes.addressof(slots), 0)

    def load_and_launch(self, ptx: str, entry: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                        shared_bytes: int, params: list[bytes], stream: int) -> None:
        """Load a PTX module, launch ``entry`` once with the given raw parameter values, wait, unload it."""
        module, functions = self.load_module(ptx, [entry], self.current_context())
        try:
            function = functions[entry]
            if shared_bytes > 48 * 1024:  # above 48 KiB dynamic shared memory is opt-in per function
                self.call("cuFuncSetAttribute", function,
                          self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
            self.launch_function(function, grid, block, shared_bytes, params, stream)
            self.call("cuStreamSynchronize", self.cu.CUstream(stream))
        finally:
            self.unload_module(module)


CUDA = CudaDriver()  # the default driver: holds nothing until its first call
