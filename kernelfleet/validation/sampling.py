"""How many clock reads a window needs: the error of sparse reads against dense ones.

Given dense SM-clock reads (every few ms), each window's true mean clock is the
step-function mean of all of them. A sampler that reads ``n`` times per window,
evenly spaced, sees the step function at ``n`` instants; its estimate's
relative error is what the clock term adds to OFU's error (OFU is linear in the
clock). ``n = 1`` is the once-per-window read of DCGM-style exporters.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from kernelfleet.catalog import Sku
from kernelfleet.errors import UsageError
from kernelfleet.ofu.aggregate import by_gpu, resample
from kernelfleet.ofu.core import ofu, ofu_ratio
from kernelfleet.telemetry.clock import step_mean
from kernelfleet.telemetry.sample import Sample

STEADY_SM_ACTIVE = 0.5
# A window's mean clock is a reference only if it rests on reads inside the window. The
# sampler's adaptive polling reads once a window while the clock held still through the last
# one (docs/telemetry.md); such a window's mean *is* its one read, so the instant read would
# match it by construction, not by measurement. Dense windows have 10 (100-ms polls) or more.
DENSE_CLOCK_POLLS = 2


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


def polled_clock_errors(
    reads: Sequence[tuple[float, float]], window_seconds: float, poll_seconds: float, phases: int = 20
) -> list[float]:
    """Signed relative errors ((estimate - truth) / truth) of each full window's mean clock as the
    sampler makes it: a read every ``poll_seconds`` on a schedule that runs on across windows, each
    window's mean the step function of its reads with the last read before it carrying in
    (``step_mean``, as ``ClockPoller.take``). ``phases`` offsets of the schedule within one poll period."""
    if poll_seconds <= 0 or window_seconds <= 0 or len(reads) < 2:
        raise UsageError("need >= 2 reads, a positive window and a positive poll period")
    times = [t for t, _ in reads]
    values = [v for _, v in reads]
    errors = []
    for phase in range(phases):
        first = times[0] + window_seconds / 2 + poll_seconds * phase / phases
        polls = [(first + k * poll_seconds, value_at(times, values, first + k * poll_seconds))
                 for k in range(int((times[-1] - first) / poll_seconds) + 1)]
        poll_times = [t for t, _ in polls]
        start = first
        while start + window_seconds <= times[-1]:
            end = start + window_seconds
            lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
            truth = step_mean(reads[lo:hi], start, end, value_at(times, values, start)).mean
            # reads at (start, end]: the one at ``start`` closed the window before and carries in
            p_lo, p_hi = bisect.bisect_right(poll_times, start + 1e-9), bisect.bisect_right(poll_times, end + 1e-9)
            estimate = step_mean(polls[p_lo:p_hi], start, end, polls[p_lo - 1][1]).mean
            errors.append((estimate - truth) / truth)  # type: ignore[operator]
            start = end
    return errors


def instant_clock_errors_pp(
    samples: Sequence[Sample], sku: Sku | None, window_seconds: float, steady_only: bool = False
) -> list[float]:
    """OFU error, in percentage points, of one instantaneous clock read per window (the last,
    as a DCGM-style sampler takes it) against the window's dense mean clock.

    Windows are each GPU's ``samples`` merged to ``window_seconds`` (GPUs are separate series);
    idle and stale ones are left out, and so are samples whose clock was read fewer than
    ``DENSE_CLOCK_POLLS`` times (no dense mean to compare with): they split the series as a
    gap would. With ``steady_only``, only whole windows inside runs where every sample kept the
    SMs busy count: a long job's steady state, without its start, end and pauses.
    """
    errors = []
    for series in by_gpu(samples).values():
        for window in _windows(series, window_seconds, steady_only):
            dense = ofu(window, sku)
            if (dense.ofu_ratio is None or window.sm_clock_instant_hertz is None
                    or (window.tensor_active_ratio or 0) < 0.01):
                continue
            instant = ofu_ratio(window.tensor_active_ratio, window.sm_clock_instant_hertz,  # type: ignore[arg-type]
                                dense.reference_clock_hertz)
            errors.append(100 * abs(instant - dense.ofu_ratio))
    return errors


def _windows(series: Sequence[Sample], window_seconds: float, steady_only: bool) -> list[Sample]:
    """One GPU's samples merged to ``window_seconds`` within runs that a sparse clock read
    (and with ``steady_only`` a stale or not busy sample) breaks; steady runs keep whole windows only."""
    runs: list[list[Sample]] = [[]]
    for sample in series:
        sparse = not sample.stale and sample.sm_clock_polls < DENSE_CLOCK_POLLS
        unsteady = steady_only and (sample.stale or (sample.sm_active_ratio or 0.0) < STEADY_SM_ACTIVE)
        if sparse or unsteady:
            runs.append([])
        else:
            runs[-1].append(sample)
    merged = [m for run in runs for m in resample(run, window_seconds)]
    if steady_only:
        merged = [m for m in merged if m.window_seconds >= 0.999 * window_seconds]
    return merged
