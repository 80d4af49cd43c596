"""OFU over longer windows and over many GPUs.

Over several windows OFU is the tensor-active cycles divided by the cycles the
reference clock would have given: Σ(active_i · f_i · Δt_i / f_ref,i) / ΣΔt_i,
which is the time-weighted mean of the windows' OFU (each window's f_ref follows
the tensor pipes busy in it, ofu/core.py). Stale and unsupported
windows are left out of both sums and counted, never read as zero.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from kernelfleet.catalog import Sku
from kernelfleet.ofu.core import ofu
from kernelfleet.telemetry.sample import Sample

# Pipe and SM activities are fractions of *cycles*, so merging windows weights them by
# cycles (clock × time); that keeps merged OFU equal to the time-weighted mean of the
# windows' OFU. Bandwidths, power and the clock itself are per-second: weighted by time.
_CYCLE_FIELDS = tuple(
    f.name for f in dataclasses.fields(Sample) if f.name.endswith("_active_ratio") or f.name == "sm_occupancy_ratio"
)
_TIME_FIELDS = ("dram_bandwidth_ratio", "sm_clock_mean_hertz", "power_mean_watts") + tuple(
    f.name for f in dataclasses.fields(Sample) if f.name.endswith("_bytes_per_second")
)


@dataclass(frozen=True, slots=True)
class OfuSummary:
    """OFU of one GPU (or a set of GPUs) over a span of windows."""

    ofu_ratio: float | None
    seconds_covered: float  # time with a valid OFU reading
    seconds_missing: float  # stale or unsupported windows
    windows: int


def summarize(samples: Iterable[Sample], sku: Sku | None) -> OfuSummary:
    """Time-weighted OFU of one GPU's samples."""
    weighted = covered = missing = 0.0
    count = 0
    for sample in samples:
        count += 1
        reading = ofu(sample, sku)
        if reading.ofu_ratio is None:
            missing += sample.window_seconds
            continue
        weighted += reading.ofu_ratio * sample.window_seconds
        covered += sample.window_seconds
    return OfuSummary(weighted / covered if covered else None, covered, missing, count)


def fleet(summaries: Sequence[tuple[OfuSummary, Sku | None]], precision: str = "bf16") -> dict[str, float | None]:
    """Fleet view: mean OFU over GPUs, and achieved / peak FLOP/s where peaks are known.

    The peak-weighted figure answers "what share of the fleet's tensor capacity
    was used": a busy B200 counts for more than a busy L4.
    """
    known = [(s, sku) for s, sku in summaries if s.ofu_ratio is not None]
    mean = sum(s.ofu_ratio for s, _ in known) / len(known) if known else None  # type: ignore[misc]
    priced = [(s, sku.peak_flops(precision)) for s, sku in known if sku is not None]
    priced = [(s, peak) for s, peak in priced if peak]
    achieved = sum(s.ofu_ratio * peak for s, peak in priced) if priced else None  # type: ignore[operator]
    peak_total = sum(peak for _, peak in priced) if priced else None
    return {
        "gpus": float(len(summaries)),
        "gpus_with_ofu": float(len(known)),
        "mean_ofu_ratio": mean,
        "achieved_flops": achieved,
        "peak_flops": peak_total,
        "capacity_weighted_ofu_ratio": achieved / peak_total if achieved is not None and peak_total else None,
    }


def resample(samples: Sequence[Sample], window_seconds: float) -> list[Sample]:
    """Merge one GPU's consecutive samples into windows of about ``window_seconds``.

    Activities are cycle-weighted, rates, power and the mean clock time-weighted; the instant clock
    is the last read of the merged window, as a once-per-window sampler sees it.
    A stale sample ends a merged window and is kept as it is.
    """
    merged: list[Sample] = []
    group: list[Sample] = []

    def flush() -> None:
        if group:
            merged.append(_merge(group))
            group.clear()

    for sample in samples:
        if sample.stale:
            flush()
            merged.append(sample)
            continue
        group.append(sample)
        if sum(s.window_seconds for s in group) >= window_seconds * 0.999:
            flush()
    flush()
    return merged


def _merge(group: list[Sample]) -> Sample:
    total = sum(s.window_seconds for s in group)
    by_cycles = all(s.sm_clock_mean_hertz for s in group)  # else fall back to time weights
    values: dict[str, float | None] = {}
    for name in _CYCLE_FIELDS + _TIME_FIELDS:
        cycles = by_cycles and name in _CYCLE_FIELDS
        pairs = [
            (getattr(s, name), s.window_seconds * (s.sm_clock_mean_hertz if cycles else 1.0))  # type: ignore[operator]
            for s in group
            if getattr(s, name) is not None
        ]
        weight = sum(w for _, w in pairs)
        values[name] = sum(v * w for v, w in pairs) / weight if pairs and weight else None
    last = group[-1]
    return dataclasses.replace(
        last,
        window_seconds=total,
        sm_clock_polls=sum(s.sm_clock_polls for s in group),
        **values,
    )


def by_gpu(samples: Iterable[Sample], key: Callable[[Sample], object] = lambda s: (s.uuid, s.mig_instance)) -> dict[object, list[Sample]]:
    """Group samples per GPU (per MIG instance), preserving time order."""
    groups: dict[object, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(key(sample), []).append(sample)
    return groups
