"""OFU maths on plain numbers and hand-made samples."""

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.ofu import Bottleneck, Tile, achieved_flops, classify, corrected_ofu, ofu, tile_efficiency
from kernelfleet.ofu.aggregate import fleet, resample, summarize
from kernelfleet.ofu.tiles import executed_gemm_flops, gemm_flops
from kernelfleet.telemetry.clock import step_mean
from kernelfleet.telemetry.sample import Sample
from kernelfleet.validation.sampling import clock_sampling_errors

pytestmark = pytest.mark.unit
CATALOG = Catalog.load()
# The H200's f_ref per GPM pipe: the datasheet peak's clock over the probe-measured clock ratio.
HMMA_REF, DFMA_REF = 1.83e9 / 0.903, 1.98e9 / 0.995


def sample(**kw) -> Sample:
    base = dict(timestamp_seconds=1.0, window_seconds=1.0, gpu_index=0, uuid="GPU-a", name="NVIDIA H200",
                tensor_active_ratio=0.9, sm_clock_mean_hertz=1.5e9, sm_clock_max_hertz=1.98e9, sm_active_ratio=0.95)
    base.update(kw)
    return Sample(**base)


def test_ofu_is_tensor_active_times_clock_over_reference():
    h200 = CATALOG.get("h200-sxm")
    r = ofu(sample(), h200)  # no per-pipe split in the window: the HMMA pipe's f_ref
    assert r.ofu_ratio == pytest.approx(0.9 * 1.5e9 / HMMA_REF) and r.reference_clock_hertz == pytest.approx(HMMA_REF)
    assert r.reference_clock_source == "catalog:h200-sxm:measured" and r.reference_for == "hmma"
    a100 = CATALOG.get("a100-sxm-80gb")
    r = ofu(sample(name="NVIDIA A100-SXM4-80GB"), a100)
    assert r.reference_clock_source == "catalog:a100-sxm-80gb:datasheet" and r.reference_clock_hertz == 1.41e9


def test_the_reference_clock_follows_the_pipes_gpm_saw_busy():
    h200 = CATALOG.get("h200-sxm")
    hmma = ofu(sample(hmma_active_ratio=0.9, dfma_active_ratio=0.0), h200)
    dfma = ofu(sample(hmma_active_ratio=0.0, dfma_active_ratio=0.9), h200)
    assert (hmma.reference_clock_hertz, hmma.reference_for) == (pytest.approx(HMMA_REF), "hmma")
    assert (dfma.reference_clock_hertz, dfma.reference_for) == (pytest.approx(DFMA_REF), "dfma")
    assert dfma.ofu_ratio == pytest.approx(0.9 * 1.5e9 / DFMA_REF)
    # both busy: each pipe's cycles over its own f_ref, so f_ref is the activity-weighted harmonic mean
    both = ofu(sample(tensor_active_ratio=0.9, hmma_active_ratio=0.6, dfma_active_ratio=0.3), h200)
    assert both.ofu_ratio == pytest.approx(1.5e9 * (0.6 / HMMA_REF + 0.3 / DFMA_REF))
    assert both.reference_for == "hmma+dfma" and both.reference_clock_source == "catalog:h200-sxm:measured"
    # int8 runs on the IMMA pipe, which nothing measured on the H200: the datasheet clock
    assert ofu(sample(imma_active_ratio=0.9), h200).reference_clock_hertz == 1.83e9


def test_a_caller_that_knows_the_precision_picks_its_pipe():
    h200 = CATALOG.get("h200-sxm")
    assert ofu(sample(), h200, "fp64_tensor").reference_clock_hertz == pytest.approx(DFMA_REF)
    assert ofu(sample(dfma_active_ratio=0.9), h200, "bf16").reference_clock_hertz == pytest.approx(HMMA_REF)
    assert ofu(sample(), h200, "fp8").reference_for == "fp8"
    with pytest.raises(UsageError, match="unknown precision"):
        ofu(sample(), h200, "bfloat16")


def test_achieved_flops_publishes_its_denominator():
    h200 = CATALOG.get("h200-sxm")
    est = achieved_flops(ofu(sample(), h200), h200, "bf16")
    assert est.flops_per_second == pytest.approx(0.9 * 1.5e9 / HMMA_REF * 989.4e12)
    assert est.peak_flops == 989.4e12 and "989.4 TFLOP/s" in est.basis and "2027 MHz" in est.basis


def test_unknown_gpu_gets_ofu_but_no_flops():
    s = sample(name="NVIDIA Future GPU", sm_clock_max_hertz=2.0e9)
    r = ofu(s, CATALOG.lookup(s.name))
    assert r.ofu_ratio == pytest.approx(0.9 * 1.5 / 2.0) and r.reference_clock_source == "nvml-max-clock"
    est = achieved_flops(r, None, "bf16")
    assert est.flops_per_second is None and "not in the catalog" in est.basis


def test_missing_terms_give_none_with_a_reason():
    h200 = CATALOG.get("h200-sxm")
    assert "no GPM" in ofu(sample(gpm_supported=False, tensor_active_ratio=None), h200).reason
    assert "stale" in ofu(sample(stale=True, error="GPU is lost"), h200).reason
    assert "clock" in ofu(sample(sm_clock_mean_hertz=None), h200).reason
    assert ofu(sample(sm_clock_max_hertz=None, name="x"), None).reason.startswith("no reference clock")
    t4 = CATALOG.get("t4")
    assert achieved_flops(ofu(sample(), t4), t4, "bf16").basis.startswith("unknown: ")


def test_tile_quantization_correction():
    tile = Tile(128, 256, 64)
    assert gemm_flops(8192, 8192, 8192) == 2 * 8192**3
    assert executed_gemm_flops(8200, 8200, 8200, tile) == 2 * 8320 * 8448 * 8256
    eff = tile_efficiency(8200, 8200, 8200, tile)
    assert eff == pytest.approx(8200**3 / (8320 * 8448 * 8256))
    assert tile_efficiency(8192, 8192, 8192, tile) == 1.0
    assert corrected_ofu(0.96, 1.0, 1.25) == pytest.approx(0.768)
    with pytest.raises(UsageError):
        corrected_ofu(0.5, 2.0, 1.0)
    with pytest.raises(UsageError):
        Tile(0, 1, 1)


def test_summary_skips_stale_windows_and_counts_them():
    h200 = CATALOG.get("h200-sxm")
    windows = [sample(), sample(stale=True, error="x", tensor_active_ratio=None), sample(tensor_active_ratio=0.3)]
    s = summarize(windows, h200)
    assert s.ofu_ratio == pytest.approx((0.9 + 0.3) / 2 * 1.5e9 / HMMA_REF)
    assert (s.seconds_covered, s.seconds_missing, s.windows) == (2.0, 1.0, 3)


def test_fleet_weights_capacity_by_peak():
    h200, l4 = CATALOG.get("h200-sxm"), CATALOG.get("l4")
    a = summarize([sample()], h200)
    b = summarize([sample(name="NVIDIA L4", sm_clock_mean_hertz=0.0, tensor_active_ratio=0.0)], l4)
    view = fleet([(a, h200), (b, l4)])
    assert view["mean_ofu_ratio"] == pytest.approx(a.ofu_ratio / 2)
    expected = a.ofu_ratio * h200.peak_flops("bf16") / (h200.peak_flops("bf16") + l4.peak_flops("bf16"))
    assert view["capacity_weighted_ofu_ratio"] == pytest.approx(expected)


def test_resample_weights_activity_by_cycles():
    fast = sample(tensor_active_ratio=1.0, sm_clock_mean_hertz=1.8e9)
    slow = sample(tensor_active_ratio=0.0, sm_clock_mean_hertz=0.6e9)
    (merged,) = resample([fast, slow], 2.0)
    assert merged.window_seconds == 2.0
    assert merged.sm_clock_mean_hertz == pytest.approx(1.2e9)
    assert merged.tensor_active_ratio == pytest.approx(0.75)  # 1.8 of 2.4 Gcycles were active
    h200 = CATALOG.get("h200-sxm")
    assert ofu(merged, h200).ofu_ratio == pytest.approx(summarize([fast, slow], h200).ofu_ratio)


@pytest.mark.parametrize(
    "kw, expected",
    [
        (dict(sm_active_ratio=0.0, tensor_active_ratio=0.0), Bottleneck.IDLE),
        (dict(tensor_active_ratio=0.9), Bottleneck.TENSOR),
        (dict(tensor_active_ratio=0.0, dram_bandwidth_ratio=0.88), Bottleneck.MEMORY),
        (dict(tensor_active_ratio=0.0, sm_active_ratio=0.3), Bottleneck.LATENCY),
        (dict(tensor_active_ratio=0.0, sm_occupancy_ratio=0.01), Bottleneck.LATENCY),
        (dict(tensor_active_ratio=0.0, fp32_active_ratio=0.7), Bottleneck.CUDA_CORE),
        (dict(tensor_active_ratio=0.38, dram_bandwidth_ratio=0.40), Bottleneck.MIXED),
        (dict(stale=True), Bottleneck.UNKNOWN),
        (dict(sm_active_ratio=None), Bottleneck.UNKNOWN),
    ],
)
def test_bottleneck_classes(kw, expected):
    assert classify(sample(**kw)) is expected


def test_step_mean():
    assert step_mean([(1.0, 100.0), (2.0, 200.0)], 0.0, 3.0, 50.0).mean == pytest.approx(350 / 3)
    assert step_mean([], 0.0, 1.0, 70.0).mean == 70.0
    w = step_mean([], 0.0, 1.0, None)
    assert w.mean is None and w.reads == 0


def test_sampling_errors_vanish_on_a_constant_clock_and_grow_with_swings():
    flat = [(t / 100, 1.5e9) for t in range(500)]
    assert max(clock_sampling_errors(flat, 1.0, 1)) < 1e-12
    square = [(t / 100, 1.0e9 if (t // 10) % 2 else 2.0e9) for t in range(500)]  # 100-ms steps
    assert max(clock_sampling_errors(square, 1.0, 1)) == pytest.approx(1 / 3)
    assert max(clock_sampling_errors(square, 1.0, 20)) < 0.05
    with pytest.raises(UsageError):
        clock_sampling_errors(flat, 1.0, 0)
