"""What limited a GPU in a window, from the other GPM metrics.

Order matters: a window is idle before anything else, tensor-bound before
memory-bound (a large GEMM also moves bytes), and "latency" catches a GPU that
is on but mostly waiting — few SMs busy or few warps resident, the signature of
launch overhead, small kernels or host stalls. A busy GPU with no dominant
pipe (a training step at 38 % tensor and 40 % DRAM, say) is "mixed".

Thresholds were set on the H200 recordings in tests/data/h200: a bf16 GEMM
reads tensor 0.94 / DRAM 0.17, a copy loop DRAM 0.88, idle SM 0.00.
"""

from __future__ import annotations

from enum import Enum

from kernelfleet.telemetry.sample import Sample

IDLE_SM_ACTIVE = 0.05
TENSOR_BOUND_ACTIVE = 0.40
MEMORY_BOUND_BANDWIDTH = 0.50
LATENCY_SM_ACTIVE = 0.60
LATENCY_OCCUPANCY = 0.05
CUDA_CORE_BOUND_ACTIVE = 0.50


class Bottleneck(str, Enum):
    IDLE = "idle"
    TENSOR = "tensor-bound"
    MEMORY = "memory-bound"
    LATENCY = "low-occupancy/launch-bound"
    CUDA_CORE = "cuda-core-bound"
    MIXED = "mixed"
    UNKNOWN = "unknown"


def classify(sample: Sample) -> Bottleneck:
    """One class per window; ``UNKNOWN`` when the counters needed are missing."""
    sm, tensor = sample.sm_active_ratio, sample.tensor_active_ratio
    dram, occupancy = sample.dram_bandwidth_ratio, sample.sm_occupancy_ratio
    if sample.stale or sm is None:
        return Bottleneck.UNKNOWN
    if sm < IDLE_SM_ACTIVE and (tensor or 0.0) < 0.01:
        return Bottleneck.IDLE
    if tensor is not None and tensor >= TENSOR_BOUND_ACTIVE:
        return Bottleneck.TENSOR
    if dram is not None and dram >= MEMORY_BOUND_BANDWIDTH:
        return Bottleneck.MEMORY
    if sm < LATENCY_SM_ACTIVE or (occupancy is not None and occupancy < LATENCY_OCCUPANCY):
        return Bottleneck.LATENCY
    pipes = (sample.fp32_active_ratio, sample.fp16_active_ratio, sample.fp64_active_ratio, sample.integer_active_ratio)
    if max((p for p in pipes if p is not None), default=0.0) >= CUDA_CORE_BOUND_ACTIVE:
        return Bottleneck.CUDA_CORE
    return Bottleneck.MIXED
