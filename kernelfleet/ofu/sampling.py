"""How many clock reads a window needs: the error of sparse reads against dense ones.

Given dense SM-clock reads (every few ms), each window's true mean clock is the
step-function mean of all of them. A sampler that reads ``n`` times per window,
evenly spaced, sees the step function at ``n`` instants; its estimate's
relative error is what the clock term adds to OFU's error (OFU is linear in the
clock). ``n = 1`` is the once-per-window read of DCGM-style exporters.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from kernelfleet.catalog import Sku
from kernelfleet.errors import UsageError
from kernelfleet.ofu.aggregate import resample
from kernelfleet.ofu.core import ofu, ofu_ratio
from kernelfleet.telemetry.clock import step_mean
from kernelfleet.telemetry.sample import Sample


STEADY_SM_ACTIVE = 0.5


def value_at(times: Sequence[float], values: Sequence[float], when: float) -> float:
    """The step function's value at ``when``: the last read at or before it."""
    i = bisect.bisect_right(times, when) - 1
    return values[max(i, 0)]


def clock_sampling_errors(
    reads: Sequence[tuple[float, float]], window_seconds: float, reads_per_window: int, phases: int = 8
) -> list[float]:
    """Relative errors (|estimate - truth| / truth) over every full window and phase."""
    if reads_per_window < 1 or window_seconds <= 0 or len(reads) < 2:
        raise UsageError("need >= 2 reads, a positive window and at least one read per window")
    times = [t for t, _ in reads]
    values = [v for _, v in reads]
    errors = []
    start = times[0]
    while start + window_seconds <= times[-1]:
        end = start + window_seconds
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        truth = step_mean(reads[lo:hi], start, end, value_at(times, values, start)).mean
        step = window_seconds / reads_per_window
        for phase in range(phases):
            offset = step * phase / phases
            estimate = sum(
                value_at(times, values, start + offset + k * step) for k in range(reads_per_window)
            ) / reads_per_window
            errors.append(abs(estimate - truth) / truth)  # type: ignore[operator]
        start = end
    return errors


def instant_clock_errors_pp(
    samples: Sequence[Sample], sku: Sku | None, window_seconds: float, steady_only: bool = False
) -> list[float]:
    """OFU error, in percentage points, of one instantaneous clock read per window (the last,
    as a DCGM-style sampler takes it) against the window's dense mean clock.

    Windows are ``samples`` merged to ``window_seconds``; idle and stale ones are left out.
    With ``steady_only``, only whole windows inside runs where every sample kept the SMs
    busy count: a long job's steady state, without its start, end and pauses.
    """
    if steady_only:
        runs: list[list[Sample]] = [[]]
        for sample in samples:
            if sample.stale or (sample.sm_active_ratio or 0.0) < STEADY_SM_ACTIVE:
                runs.append([])
            else:
                runs[-1].append(sample)
        merged = [m for run in runs for m in resample(run, window_seconds) if m.window_seconds >= 0.999 * window_seconds]
    else:
        merged = resample(samples, window_seconds)
    errors = []
    for window in merged:
        dense = ofu(window, sku)
        if dense.ofu_ratio is None or window.sm_clock_instant_hertz is None or (window.tensor_active_ratio or 0) < 0.01:
            continue
        instant = ofu_ratio(window.tensor_active_ratio, window.sm_clock_instant_hertz, dense.reference_clock_hertz)  # type: ignore[arg-type]
        errors.append(100 * abs(instant - dense.ofu_ratio))
    return errors
