"""Where the host will not pin memory (here: torch without CUDA), ``saved_state(host=True)`` keeps
its copy in pageable memory instead of failing: the bytes are the same, only the copies slower."""

import pytest
import torch

from kernelfleet.kernels.cuda.replay import _on_host

pytestmark = pytest.mark.unit


def test_a_host_copy_falls_back_to_pageable_memory_where_nothing_pins():
    if torch.cuda.is_available():
        pytest.skip("this machine pins host memory: tests/gpu/test_capture.py takes the pinned path")
    bytes_ = torch.arange(4096, dtype=torch.int64).remainder(251).to(torch.uint8)  # stands in for device bytes
    held = _on_host(bytes_)
    assert torch.equal(held, bytes_) and held.data_ptr() != bytes_.data_ptr()
    assert held.dtype == torch.uint8 and held.numel() == 4096 and held.device.type == "cpu"
    assert not held.is_pinned()
