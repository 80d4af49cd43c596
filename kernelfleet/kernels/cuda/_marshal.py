"""ctypes marshalling between Python bytes and the driver's raw parameter memory (private to the
driver's modules)."""

from __future__ import annotations

import ctypes
from typing import Any


def kernel_params(params: list[bytes]) -> tuple[list[Any], Any]:
    """Raw parameter values as the driver's ``void**`` array: (the value buffers, the array); the
    caller keeps both alive until the driver has read them."""
    values = [ctypes.create_string_buffer(value, len(value)) for value in params]
    return values, (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])


def kernel_param_bytes(address: int, layout: list[tuple[int, int]]) -> list[bytes]:
    """The bytes of each (offset, size) parameter of a ``void**`` array at ``address``."""
    slots = ctypes.cast(address, ctypes.POINTER(ctypes.c_void_p))
    return [ctypes.string_at(slots[i], size) for i, (_, size) in enumerate(layout)]


def extra_buffer(address: int) -> bytes:
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
