"""The one doorway to each CUDA API (STYLE.md, rule 2): every ``cuda.bindings`` call goes through
:class:`Doorway`, which turns a failed status into a :class:`DriverError` naming the function,
the driver's own error name and what to do about it.

Importing this module imports no cuda-python: the bindings are loaded at the first call, so the
null twin (``null.py``) and the pure layers can name :class:`DriverError` on a machine without them.
"""

from __future__ import annotations

import importlib
from typing import Any

from kernelfleet.errors import EnvironmentProblem, KernelfleetError

# One line each: what to do when the driver answers this (driver API names; the runtime API's
# ``cudaError*`` names get the generic remedy).
REMEDIES = {
    "CUDA_ERROR_NO_DEVICE": "no CUDA GPU is visible to this process: check nvidia-smi and CUDA_VISIBLE_DEVICES",
    "CUDA_ERROR_NOT_INITIALIZED": "the driver was not initialised in this process: create a CUDA context first "
                                  "(e.g. torch.cuda.init()) before asking the driver",
    "CUDA_ERROR_INVALID_CONTEXT": "no usable context is current on this thread: make the device current "
                                  "(torch.cuda.set_device) or push the context that owns the handles",
    "CUDA_ERROR_OUT_OF_MEMORY": "the GPU is out of memory: free tensors or captures, use fewer slots or smaller "
                                "batches, or check nvidia-smi for other processes on it",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel touched memory it does not own and the context is poisoned: "
                                  "restart the process (rerun with CUDA_LAUNCH_BLOCKING=1 to find the launch)",
    "CUDA_ERROR_LAUNCH_FAILED": "a kernel failed and the context is poisoned: restart the process "
                                "(rerun with CUDA_LAUNCH_BLOCKING=1 to find the launch)",
    "CUDA_ERROR_NOT_SUPPORTED": "this GPU or driver does not offer the feature (green contexts need Hopper and "
                                "driver 550+): use a whole-GPU profile or a newer driver",
    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED": "these two GPUs cannot reach each other's memory: choose the memcpy copy "
                                          "method, or GPUs joined by NVLink or one PCIe switch",
    "CUDA_ERROR_INVALID_HANDLE": "a handle was released already or belongs to another context: build the graph "
                                 "or load the module again in this context",
    "CUDA_ERROR_INVALID_VALUE": "the driver refused an argument: an address, size or handle from another context "
                                "or an outdated capture; capture again in this process",
}
GENERIC_REMEDY = "look the error name up in the CUDA driver API documentation; rerun with CUDA_LAUNCH_BLOCKING=1 to find the call"


def remedy(name: str) -> str:
    """What to do about the driver error ``name`` (e.g. ``CUDA_ERROR_OUT_OF_MEMORY``), one line."""
    return REMEDIES.get(name, GENERIC_REMEDY)


class DriverError(KernelfleetError):
    """A CUDA driver call failed. ``name``: the driver's error name (None when the failure is ours,
    e.g. a partition that does not fit); the message ends with what to do."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name

    @classmethod
    def refused(cls, function: str, name: str) -> DriverError:
        """The driver answered ``name`` to ``function``: what failed, and what to do."""
        return cls(f"{function} failed: {name}; {remedy(name)}", name)


class Doorway:
    """``doorway(function, *args)`` calls ``cuda.bindings.<api>.<function>(*args)`` and returns its
    results without the status (a single one bare). ``bindings``: the module to call (None: the
    real one, imported at the first call), so a test can hand in a fake one."""

    def __init__(self, api: str = "driver", bindings: Any = None) -> None:
        self.api, self._bindings = api, bindings

    @property
    def bindings(self) -> Any:
        """The bindings module; its enums and structs are what arguments are made of."""
        if self._bindings is None:
            try:
                self._bindings = importlib.import_module(f"cuda.bindings.{self.api}")
            except ImportError as exc:  # pragma: no cover - part of the [place] extra
                raise EnvironmentProblem(f"cuda-python is missing ({exc}); pip install 'kernelfleet[place]'") from exc
        return self._bindings

    def __call__(self, function: str, *args: Any, also_fine: tuple[str, ...] = ()) -> Any:
        """``also_fine``: error names that mean the call has nothing to do (e.g. already enabled)."""
        result = getattr(self.bindings, function)(*args)
        status, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
        # Both APIs' status enums are ints with names, 0 being success (CUDA_SUCCESS, cudaSuccess).
        if int(status) != 0 and status.name not in also_fine:
            raise DriverError.refused(function, status.name)
        return rest[0] if len(rest) == 1 else rest


class Doorways:
    """What the real driver's parts (graph reading, graph building, green contexts) share: the
    driver API's doorway ``call``, the runtime API's ``runtime``, and ``cu``, the driver bindings'
    enums and structs."""

    def __init__(self, bindings: Any = None, runtime_bindings: Any = None) -> None:
        self.call = Doorway("driver", bindings)
        self.runtime = Doorway("runtime", runtime_bindings)

    @property
    def cu(self) -> Any:
        return self.call.bindings
