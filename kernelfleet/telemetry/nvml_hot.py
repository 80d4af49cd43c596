"""The reads made every clock poll and every window, bound once to NVML's C functions.

Each of these reads is ~1-2 µs inside NVML, but pynvml's wrapper around it allocates the
out-param, wraps the enum arguments, looks the function up and raises on any non-zero status;
and the Xid drain's usual answer (TIMEOUT: no event) went through two exception objects a
window. A :func:`bind` call does the lookup, the out-param and the argument conversion once, so
a read is one C call and a status check. Statuses still become kernelfleet errors through
the doorway (:meth:`Nvml.error`), so callers see the same errors as from :meth:`Nvml.call`.

Where the module has no C side (a twin without one) the bound read goes through
:meth:`Nvml.call` and returns the same values.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

from kernelfleet.errors import Unsupported
from kernelfleet.telemetry.nvml_api import Nvml, NvmlCallFailed

Read = Callable[[], Any]


def bind(nvml: Nvml, function: str, args: tuple[Any, ...], out: type, after: tuple[Any, ...] = (),
         quiet: int | None = None, direct: bool = True, scale: float = 1) -> Read:
    """A read of ``function(*args, &out, *after)`` that returns the out-param's value.

    A scalar out-param gives its ``.value`` times ``scale``; a structure is returned itself,
    reused by every call (copy what you keep before the next). A status equal to ``quiet``
    returns ``None`` instead of raising (TIMEOUT for an empty event set). Arguments given to the
    read itself go last (an event wait's timeout in ms, which changes every call). ``direct=False``
    keeps pynvml's wrapper (the path every read took before; bench/sampler_cost.py measures both).
    """
    fn = nvml.function_pointer(function) if direct else None
    if fn is None:
        return _through_doorway(nvml, function, (*args, *after), quiet, scale)
    value = ctypes.pointer(out())  # one out-param for the read's lifetime; NVML writes through it
    cargs = (*(_c(a) for a in args), value, *(_c(a) for a in after))
    target = value.contents
    scalar = not isinstance(target, ctypes.Structure)
    error = nvml.error

    def read(*late: int) -> Any:
        status = fn(*cargs, *map(_c, late)) if late else fn(*cargs)
        if status:
            if status == quiet:
                return None
            raise error(function, status)
        return target.value * scale if scalar else target

    return read


def _through_doorway(nvml: Nvml, function: str, args: tuple[Any, ...], quiet: int | None, scale: float) -> Read:
    def read(*late: int) -> Any:
        try:
            value = nvml.call(function, *args, *late)
            return value * scale if scale != 1 else value
        except NvmlCallFailed as exc:
            if exc.code == quiet:
                return None
            raise

    return read


def _c(arg: Any) -> Any:
    # NVML's enums and counts are unsigned ints; handles and sets are already ctypes pointers.
    return ctypes.c_uint(arg) if isinstance(arg, int) else arg


def clock_reader(nvml: Nvml, handle: Any, direct: bool = True) -> Callable[[], float]:
    """The GPU's SM clock in hertz, for the poll loop."""
    return bind(nvml, "nvmlDeviceGetClockInfo", (handle, nvml.m.NVML_CLOCK_SM), ctypes.c_uint, direct=direct,
                scale=1e6)


def read_optional(read: Read) -> Any:
    """``read()``, or ``None`` where the GPU does not support it (like :meth:`Nvml.optional`)."""
    try:
        return read()
    except Unsupported:
        return None


@functools.cache
def plain_layout(struct: type) -> type:
    """A ctypes structure laid out as ``struct`` without pynvml's per-field Python hooks.

    pynvml's structures run a Python ``__getattribute__`` and ``__setattr__`` on every field (to
    turn bytes into str): a GPM request's 15 metrics are 45 such accesses a window, 34-36 µs of CPU
    warm on the CPU dev VM against 8-11 through a plain structure of the same layout
    (``bench.sampler_cost --twin``). NVML takes a pointer to the memory and sees no difference. A type without ``_fields_`` (the twin's request)
    is returned as it is.
    """
    fields = getattr(struct, "_fields_", None)
    if fields is None or not issubclass(struct, ctypes.Structure):
        return struct
    plain = []
    for name, kind in fields:
        if issubclass(kind, ctypes.Array) and issubclass(kind._type_, ctypes.Structure):
            kind = plain_layout(kind._type_) * kind._length_
        elif issubclass(kind, ctypes.Structure):
            kind = plain_layout(kind)
        plain.append((name, kind))
    namespace: dict[str, Any] = {"_fields_": plain}
    if hasattr(struct, "_pack_"):
        namespace["_pack_"] = struct._pack_
    return type(f"Plain{struct.__name__}", (ctypes.Structure,), namespace)
