"""Where the host will not pin memory (here: torch without CUDA), ``saved_state(host=True)`` keeps
its copy in pageable memory instead of failing: the bytes are the same, only the copies slower."""

import pytest
import torch

from kernelfleet.kernels.cuda.replay import _host_bytes

pytestmark = pytest.mark.unit


def test_host_bytes_fall_back_to_pageable_memory_where_nothing_pins():
    if torch.cuda.is_available():
        pytest.skip("this machine pins host memory: tests/gpu/test_capture.py takes the pinned path")
    held = _host_bytes(4096)
    assert held.dtype == torch.uint8 and held.numel() == 4096 and held.device.type == "cpu"
    assert not held.is_pinned()
