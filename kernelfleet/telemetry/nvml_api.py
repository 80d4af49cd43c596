"""The one doorway to NVML (STYLE.md, rule 2).

Every NVML call in kernelfleet goes through :meth:`Nvml.call`, which turns NVML
status codes into kernelfleet errors. The ``pynvml`` module is passed in, so a
CPU twin with the same functions can stand in for it in tests.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from kernelfleet.errors import EnvironmentProblem, KernelfleetError, Unsupported

REPLAY_HINT = "to look at a recording instead, pass --replay FILE"


def text(value: str | bytes) -> str:
    """A string NVML returned (older pynvml gives bytes)."""
    return value.decode() if isinstance(value, bytes) else value


class NvmlCallFailed(KernelfleetError):
    """An NVML call failed at run time (GPU lost, driver hiccup): the sample is stale."""

    def __init__(self, function: str, code: int, text: str) -> None:
        super().__init__(f"{function} failed: {text} (NVML code {code})")
        self.function = function
        self.code = code


class Nvml:
    """NVML through one function; ``module`` is ``pynvml`` or a CPU twin of it."""

    def __init__(self, module: types.ModuleType | None = None) -> None:
        if module is None:
            try:
                import pynvml as module  # nvidia-ml-py
            except ImportError as exc:  # pragma: no cover - a dependency of the package
                raise EnvironmentProblem(
                    f"the Python package nvidia-ml-py is missing ({exc}); "
                    "pip install nvidia-ml-py"
                ) from exc
        self.m = module
        self._unavailable = {
            getattr(module, "NVML_ERROR_LIBRARY_NOT_FOUND", -1): "libnvidia-ml.so was not found",
            getattr(module, "NVML_ERROR_DRIVER_NOT_LOADED", -1): "the NVIDIA driver is not loaded",
            getattr(module, "NVML_ERROR_NO_PERMISSION", -1): "no permission to open the GPU",
            getattr(module, "NVML_ERROR_FUNCTION_NOT_FOUND", -1): "this driver is too old",
        }
        self._unsupported = {
            getattr(module, "NVML_ERROR_NOT_SUPPORTED", -1),
            getattr(module, "NVML_ERROR_FUNCTION_NOT_FOUND", -1),
        }

    def init(self) -> None:
        """Initialise NVML; a missing driver is one clear line that points at replay."""
        try:
            self.m.nvmlInit()
        except self.m.NVMLError as exc:
            why = self._unavailable.get(exc.value, str(exc))
            raise EnvironmentProblem(f"cannot read GPUs through NVML: {why}; {REPLAY_HINT}") from exc
        except OSError as exc:  # a broken libnvidia-ml.so
            raise EnvironmentProblem(f"cannot load NVML ({exc}); {REPLAY_HINT}") from exc

    def shutdown(self) -> None:
        try:
            self.m.nvmlShutdown()
        except self.m.NVMLError:
            pass  # shutting down a lost GPU's NVML can fail; nothing to keep

    def call(self, function: str, *args: Any) -> Any:
        """Call ``pynvml.<function>(*args)``.

        Raises :class:`Unsupported` when the GPU or driver lacks the function,
        :class:`NvmlCallFailed` for any other NVML status.
        """
        fn: Callable[..., Any] = getattr(self.m, function)
        try:
            return fn(*args)
        except self.m.NVMLError as exc:
            raise self.error(function, exc.value) from exc

    def error(self, function: str, code: int) -> KernelfleetError:
        """The kernelfleet error for NVML status ``code`` from ``function`` (also for calls made
        through :meth:`function_pointer`, which return the status instead of raising)."""
        if code in self._unsupported:
            return Unsupported(f"{function}: not supported on this GPU or driver")
        return NvmlCallFailed(function, code, str(self.m.NVMLError(code)))

    def function_pointer(self, function: str) -> Callable[..., int] | None:
        """The C function of the loaded NVML library (it returns the NVML status), or ``None``
        where the module offers none (a twin without a C side) or the driver lacks it.

        pynvml's own per-call wrapper (out-param allocation, enum wrapping, status check) is most
        of a cheap read's CPU; telemetry/nvml_hot.py calls the C function directly for the reads
        made every poll and every window. ``_nvmlGetFunctionPointer`` is pynvml's (nvidia-ml-py)
        cached lookup, the same one its wrappers use.
        """
        lookup = getattr(self.m, "_nvmlGetFunctionPointer", None)
        if lookup is None:
            return None
        try:
            return lookup(function)
        except self.m.NVMLError:
            return None  # FUNCTION_NOT_FOUND (an older driver) or NVML not initialised

    def optional(self, function: str, *args: Any) -> Any:
        """Like :meth:`call`, but ``None`` when the GPU does not support it."""
        try:
            return self.call(function, *args)
        except Unsupported:
            return None
