"""OFU: the fraction of a GPU's tensor-pipe capacity used over a window.

    OFU = tensor_active × f_SM / f_ref

``tensor_active`` is the fraction of cycles any tensor pipe was busy (GPM
ANY_TENSOR_UTIL). Cycles, not seconds: under the power cap the SM clock drops,
the pipe does less per second at the same busy fraction, and the clock term
scales that back. ``f_SM`` is the SM clock NVML reports, averaged over the window.

``f_ref`` makes ``OFU × dense peak`` the achieved tensor FLOP/s of whichever
precision ran: the clock the peak is defined at, over the measured ratio of the
SM cycles that really elapse to NVML's clock while that tensor pipe works
(``Sku.ofu_reference_clock``). On the H200 a probe kernel counted 0.903 × NVML's
clock during HMMA-pipe GEMMs and 0.995 during DMMA, so f_ref is 1830 / 0.903 =
2027 MHz for fp16/bf16/tf32/fp8 work and 1980 / 0.995 = 1990 MHz for fp64
(docs/validation/ofu.md). GPM splits the busy fraction by pipe (HMMA, IMMA,
DFMA), so a window's f_ref follows the pipes that were busy in it; a window
without the split is taken as HMMA work. OFU may exceed 1 when NVML's clock runs
above f_ref × the measured ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelfleet.catalog import Sku
from kernelfleet.catalog.model import DEFAULT_PIPE
from kernelfleet.telemetry.sample import Sample


@dataclass(frozen=True, slots=True)
class OfuReading:
    """OFU of one window, with every number it was made from."""

    ofu_ratio: float | None
    tensor_active_ratio: float | None
    sm_clock_hertz: float | None
    reference_clock_hertz: float | None
    reference_clock_source: str  # "catalog:<key>:measured|datasheet", "nvml-max-clock" or "none"
    reason: str | None = None  # why ofu_ratio is None
    # What f_ref was chosen for: the precision the caller named, or the GPM pipes busy in the
    # window ("hmma", "dfma", "hmma+dfma"; "hmma" too when the window has no per-pipe split).
    reference_for: str | None = None


def ofu_ratio(tensor_active_ratio: float, sm_clock_hertz: float, reference_clock_hertz: float) -> float:
    """The formula itself, on plain numbers."""
    return tensor_active_ratio * sm_clock_hertz / reference_clock_hertz


def reference_clock(sample: Sample, sku: Sku | None, precision: str | None = None) -> tuple[float | None, str, str | None]:
    """f_ref for one window, where it came from, and what it was chosen for.

    With a known SKU: the f_ref of ``precision``'s pipe when the caller knows what ran; else of
    the pipes GPM saw busy in the window, each weighted by its busy fraction (a harmonic mean:
    OFU adds up each pipe's busy cycles over its own f_ref); else, with no per-pipe split, the
    HMMA pipe's. The source names the SKU and whether it has a measured clock ratio, and stays
    the same from window to window (it is a Prometheus label). An unknown GPU still gets OFU
    (relative to its top clock), but never a FLOP/s figure: that would need a peak we do not know.
    """
    if sku is not None:
        source = f"catalog:{sku.key}:{'measured' if sku.tensor_clock_ratio else 'datasheet'}"
        if precision is not None:
            return sku.ofu_reference_clock_of(precision)[0], source, precision
        pipes = _busy_pipes(sample)
        if not pipes:
            return sku.ofu_reference_clock(DEFAULT_PIPE)[0], source, DEFAULT_PIPE
        harmonic = sum(share / sku.ofu_reference_clock(pipe)[0] for pipe, share in pipes.items())
        return sum(pipes.values()) / harmonic, source, "+".join(pipes)
    if sample.sm_clock_max_hertz:
        return sample.sm_clock_max_hertz, "nvml-max-clock", None
    return None, "none", None


def _busy_pipes(sample: Sample) -> dict[str, float]:
    """GPM's per-pipe busy fractions that are above zero, in catalog order."""
    ratios = {"hmma": sample.hmma_active_ratio, "imma": sample.imma_active_ratio, "dfma": sample.dfma_active_ratio}
    return {pipe: r for pipe, r in ratios.items() if r}


def ofu(sample: Sample, sku: Sku | None, precision: str | None = None) -> OfuReading:
    """OFU of one sample. ``None`` with a reason when a term is missing.

    ``precision``, where the caller knows what ran (a benchmark, a profiled kernel), picks the
    f_ref of its tensor pipe; without it the window's own per-pipe activity does.
    """
    ref, ref_source, ref_for = reference_clock(sample, sku, precision)
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
        return OfuReading(None, active, clock, ref, ref_source, reason, ref_for)
    assert active is not None and clock is not None and ref is not None  # narrowed above
    return OfuReading(ofu_ratio(active, clock, ref), active, clock, ref, ref_source, reference_for=ref_for)


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
        ref = reading.reference_clock_hertz or sku.ofu_clock_hertz
        basis = (
            f"OFU {reading.ofu_ratio:.3f} x {precision} dense peak {peak / 1e12:.1f} TFLOP/s "
            f"normalised at {ref / 1e6:.0f} MHz ({sku.key})"
        )
    return FlopsEstimate(precision, value, peak, reading.reference_clock_hertz, reading.ofu_ratio, basis)
