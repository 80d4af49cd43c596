"""OFU: the fraction of a GPU's tensor-pipe capacity used over a window.

    OFU = tensor_active × f_SM / f_ref

``tensor_active`` is the fraction of cycles any tensor pipe was busy (GPM
ANY_TENSOR_UTIL). Cycles, not seconds: under the power cap the SM clock drops,
the pipe does less per second at the same busy fraction, and the clock term
scales that back. ``f_ref`` is the clock at which the datasheet dense peak is
defined, so ``OFU × dense peak`` estimates the achieved tensor FLOP/s of
whichever precision ran. OFU may exceed 1 when the clock runs above ``f_ref``
(an H200 boosts to 1980 MHz; its peak is defined at 1830 MHz).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelfleet.catalog import Sku
from kernelfleet.telemetry.sample import Sample


@dataclass(frozen=True, slots=True)
class OfuReading:
    """OFU of one window, with every number it was made from."""

    ofu_ratio: float | None
    tensor_active_ratio: float | None
    sm_clock_hertz: float | None
    reference_clock_hertz: float | None
    reference_clock_source: str  # "catalog:<key>", "nvml-max-clock" or "none"
    reason: str | None = None  # why ofu_ratio is None


def ofu_ratio(tensor_active_ratio: float, sm_clock_hertz: float, reference_clock_hertz: float) -> float:
    """The formula itself, on plain numbers."""
    return tensor_active_ratio * sm_clock_hertz / reference_clock_hertz


def reference_clock(sample: Sample, sku: Sku | None) -> tuple[float | None, str]:
    """The catalog's f_ref; for an unknown SKU, the GPU's own max SM clock.

    The catalog gives a measured clock where a measurement settled it (on the
    H200 OFU × peak matches timed FLOP/s with 1980 MHz, not the 1830 MHz the
    datasheet arithmetic implies), else the datasheet's. An unknown GPU still
    gets OFU (relative to its top clock), but never a FLOP/s figure: that would
    need a peak we do not know.
    """
    if sku is not None:
        basis = "measured" if sku.measured_ofu_clock_hertz else "datasheet"
        return sku.ofu_clock_hertz, f"catalog:{sku.key}:{basis}"
    if sample.sm_clock_max_hertz:
        return sample.sm_clock_max_hertz, "nvml-max-clock"
    return None, "none"


def ofu(sample: Sample, sku: Sku | None) -> OfuReading:
    """OFU of one sample. ``None`` with a reason when a term is missing."""
    ref, ref_source = reference_clock(sample, sku)
    clock = sample.sm_clock_mean_hertz
    active = sample.tensor_active_ratio
    reason = None
    if sample.stale:
        reason = f"stale sample: {sample.error}"
    elif not sample.gpm_supported:
        reason = "this GPU has no GPM tensor counters (Hopper or newer needed)"
    elif active is None:
        reason = "tensor activity unavailable in this window"
    elif clock is None:
        reason = "SM clock unavailable in this window"
    elif ref is None:
        reason = "no reference clock: unknown GPU and NVML gave no max clock"
    if reason is not None:
        return OfuReading(None, active, clock, ref, ref_source, reason)
    assert active is not None and clock is not None and ref is not None  # narrowed above
    return OfuReading(ofu_ratio(active, clock, ref), active, clock, ref, ref_source)


@dataclass(frozen=True, slots=True)
class FlopsEstimate:
    """Achieved tensor FLOP/s for one precision, published with its denominator."""

    precision: str
    flops_per_second: float | None
    peak_flops: float | None  # dense peak at the reference clock
    reference_clock_hertz: float | None
    ofu_ratio: float | None
    basis: str  # one line a person can check


def achieved_flops(reading: OfuReading, sku: Sku | None, precision: str) -> FlopsEstimate:
    """``OFU × dense peak(precision)``; unknown when the SKU or its peak is unknown."""
    peak = sku.peak_flops(precision) if sku is not None else None
    if reading.ofu_ratio is None:
        basis = f"unknown: {reading.reason}"
        value = None
    elif sku is None:
        basis = "unknown: GPU not in the catalog, so no peak to scale by"
        value = None
    elif peak is None:
        basis = f"unknown: {sku.name} has no {precision} tensor peak"
        value = None
    else:
        value = reading.ofu_ratio * peak
        basis = (
            f"OFU {reading.ofu_ratio:.3f} x {precision} dense peak {peak / 1e12:.1f} TFLOP/s "
            f"normalised at {sku.ofu_clock_hertz / 1e6:.0f} MHz ({sku.key})"
        )
    return FlopsEstimate(precision, value, peak, reading.reference_clock_hertz, reading.ofu_ratio, basis)
