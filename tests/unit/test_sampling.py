"""One clock read per window against the window's dense mean, on hand-made samples."""

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.telemetry.sample import Sample
from kernelfleet.validation.sampling import instant_clock_errors_pp

pytestmark = pytest.mark.unit
H200 = Catalog.load().get("h200-sxm")


def window(t: float, uuid: str = "GPU-a", mean: float = 1.5e9, instant: float = 1.5e9, polls: int = 10,
           sm_active: float = 0.9) -> Sample:
    return Sample(timestamp_seconds=t, window_seconds=1.0, gpu_index=0, uuid=uuid, name="NVIDIA H200",
                  tensor_active_ratio=0.792, sm_active_ratio=sm_active, sm_clock_mean_hertz=mean,
                  sm_clock_instant_hertz=instant, sm_clock_polls=polls, sm_clock_max_hertz=1.98e9)


def test_the_error_is_the_instant_reads_distance_from_the_mean_in_ofu_points():
    # 0.792 busy: a miss of 1 % of f_ref is 0.792 pp of OFU
    errors = instant_clock_errors_pp([window(1, instant=1.5e9 + H200.ofu_clock_hertz / 100)], H200, 1.0)
    assert errors == [pytest.approx(0.792)]


def test_each_gpu_is_its_own_series():
    # two GPUs' windows interleaved, as a multi-GPU recording yields them; merged per GPU
    miss = H200.ofu_clock_hertz / 100
    mixed = [window(t, uuid=u, instant=1.5e9 + (miss if u == "GPU-b" else 0)) for t in range(1, 11) for u in ("GPU-a", "GPU-b")]
    errors = instant_clock_errors_pp(mixed, H200, 10.0, steady_only=True)
    assert sorted(errors) == [pytest.approx(0.0, abs=1e-12), pytest.approx(0.792)]


def test_a_window_read_once_has_no_dense_mean_and_breaks_the_steady_run():
    run = [window(t) for t in range(1, 21)]
    assert len(instant_clock_errors_pp(run, H200, 10.0, steady_only=True)) == 2
    run[4] = window(5, polls=1)  # adaptive polling judged the clock still: mean == the one read
    assert len(instant_clock_errors_pp(run, H200, 10.0, steady_only=True)) == 1  # 4 + 15 busy: one whole window
    assert len(instant_clock_errors_pp(run, H200, 1.0)) == 19


def test_steady_runs_end_where_the_sms_go_quiet():
    run = [window(t, sm_active=0.3 if t == 11 else 0.9) for t in range(1, 31)]
    assert len(instant_clock_errors_pp(run, H200, 10.0, steady_only=True)) == 2  # 1-10 and 12-21; 22-30 is partial
    assert len(instant_clock_errors_pp(run, H200, 10.0)) == 3
