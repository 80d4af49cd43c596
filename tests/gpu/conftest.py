"""The GPU tier: what a run on an NVIDIA GPU must show, asserted. On a GPU machine, from the
repository root: ``pytest -m gpu tests/gpu -s`` (one GPU, a few minutes; ``-s`` shows the figures
each test prints). Every test here is skipped, with the reason, where torch sees no CUDA device
or NVML finds no GPU, so the CPU suite passes without one.

The files run in name order; the two that carve green-context partitions come last
(``test_partition_*``): partitions live as long as the process (``profile/devices.py``), and the
captures of the other tests are made before any exists, as ``bench/capture_run.py`` makes them.
"""

from __future__ import annotations

import pytest


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the GPU tier, or None when it can."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    from kernelfleet.errors import KernelfleetError
    from kernelfleet.telemetry.nvml_api import Nvml

    nvml = Nvml()
    try:
        nvml.init()
        count = nvml.call("nvmlDeviceGetCount")
        nvml.shutdown()
    except KernelfleetError as exc:
        return f"NVML: {exc}"
    return None if count else "NVML finds no GPU"


@pytest.fixture(scope="session", autouse=True)
def gpu() -> None:
    reason = no_gpu_reason()
    if reason is not None:
        pytest.skip(f"needs an NVIDIA GPU: {reason}")
