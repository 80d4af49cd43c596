"""What the store is given to write (a GPU's window, a job's hold on a GPU) and how long it keeps it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One window of one GPU as the store keeps it (the agent builds these from Samples)."""

    host: str
    uuid: str
    mig_instance: int | None
    gpu_index: int
    name: str
    sku: str | None
    ts: float
    window_seconds: float
    bottleneck: str
    stale: bool
    ofu: float | None
    tensor_active: float | None
    sm_clock_hertz: float | None
    sm_active: float | None
    sm_occupancy: float | None
    dram_bandwidth: float | None
    power_watts: float | None


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job's hold on one GPU in one window; ``share`` < 1 when the GPU was shared."""

    job: str
    kind: str
    user: str | None
    host: str
    uuid: str
    mig_instance: int | None
    ts: float
    share: float
    approximate: bool


@dataclass(frozen=True, slots=True)
class Retention:
    """How long each resolution is kept, and the most bytes the store's file may hold (past it the
    oldest raw windows go first, then the oldest minutes, then the oldest hours)."""

    raw_seconds: float = 24 * 3600
    minute_seconds: float = 30 * 24 * 3600
    hour_seconds: float = 400 * 24 * 3600
    budget_bytes: int = 5 * 10**9
