"""What the store is given to write (a window batch as columns, or a GPU's window and a job's hold
on a GPU as rows) and how long it keeps it."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

from kernelfleet.errors import UsageError
from kernelfleet.fleet.store_schema import METRICS


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


# Which GPU a batch's row is: GpuRow's first six fields (the writer registers a GPU by the first three).
GpuKey = NamedTuple("GpuKey", [(f.name, f.type) for f in fields(GpuRow)[:6]])  # type: ignore[misc]
# One job's hold on one GPU in a batch's window: a JobRow without its ts (the batch's row has it).
Hold = NamedTuple("Hold", [(f.name, f.type) for f in fields(JobRow) if f.name != "ts"])  # type: ignore[misc]

_COLUMNS = operator.attrgetter("ts", "window_seconds", *METRICS, "bottleneck", "stale")
_GPU = operator.attrgetter(*GpuKey._fields)
_HOLD = operator.attrgetter(*Hold._fields)


@dataclass(frozen=True, slots=True)
class Batch:
    """One window batch as columns, a place per GPU row: what the agent hands the store, made once
    a window. (Row objects read attribute by attribute, and transposed, cost the writer as much
    Python as its SQL took time: the writer now takes the columns as they come.)"""

    gpus: Sequence[GpuKey]
    ts: Sequence[float]
    window_seconds: Sequence[float]
    metrics: Sequence[Sequence[float | None]]  # a column per name of store_schema.METRICS, in its order
    bottleneck: Sequence[str]
    stale: Sequence[bool]
    holds: Sequence[Hold] = ()  # of GPUs among ``gpus``

    def __post_init__(self) -> None:
        n = len(self.gpus)
        lengths = (len(self.ts), len(self.window_seconds), len(self.bottleneck), len(self.stale), *map(len, self.metrics))
        if len(self.metrics) != len(METRICS) or lengths.count(n) != len(lengths):
            raise UsageError(f"a store batch needs {n} places in every column and {len(METRICS)} metric columns "
                             f"({', '.join(METRICS)}); got {len(self.metrics)} metric columns of lengths {lengths}")

    @classmethod
    def of(cls, rows: Sequence[GpuRow], jobs: Sequence[JobRow] = ()) -> Batch:
        """The batch of ``rows`` and ``jobs`` (transposed in C)."""
        if not rows:
            return cls((), (), (), ((),) * len(METRICS), (), (), tuple(map(Hold._make, map(_HOLD, jobs))))
        ts, window_seconds, *metrics, names, stale = zip(*map(_COLUMNS, rows))
        return cls(tuple(map(GpuKey._make, map(_GPU, rows))), ts, window_seconds, metrics, names, stale,
                   tuple(map(Hold._make, map(_HOLD, jobs))))
