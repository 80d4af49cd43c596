"""The default SM-clock poll period against the 2-ms clock reads recorded on an H200: what a
1-s window's mean clock (and so OFU) loses at 250 ms, as the sampler reads (docs/telemetry.md,
"The clock poll default")."""

import gzip
import json
import statistics

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.telemetry.clock import CLOCK_POLL_SECONDS
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.validation.sampling import clock_sampling_errors, polled_clock_errors

pytestmark = pytest.mark.replay


@pytest.fixture
def loads(h200_trace):
    runs = json.loads(gzip.decompress((h200_trace / "clock-reads-2ms.json.gz").read_bytes()))
    return {name: [(t, mhz * 1e6) for t, mhz in reads] for name, reads in runs.items()}


def mean_abs(errors):
    return statistics.mean(abs(e) for e in errors)


def test_the_source_and_the_cli_poll_at_the_default():
    assert NvmlSource().clock_poll_seconds == CLOCK_POLL_SECONDS == 0.25


@pytest.mark.parametrize(("load", "ofu"), [("gemm", 0.68), ("transformer", 0.36)])
def test_the_default_keeps_the_clock_term_within_its_budget(loads, load, ofu):
    """Budget: bias under 0.1 % (what minute rollups and reports keep), and a window's mean OFU
    error under 0.5 pp (the bf16 accuracy target) at the OFU the load ran at."""
    errors = polled_clock_errors(loads[load], 1.0, CLOCK_POLL_SECONDS)
    assert len(errors) == 180
    assert abs(statistics.mean(errors)) < 0.001
    assert 100 * ofu * mean_abs(errors) < 0.5


def test_reads_off_the_100_ms_grid_lose_more_than_reads_on_it(loads):
    by_poll = {poll: mean_abs(polled_clock_errors(loads["transformer"], 1.0, poll)) for poll in (0.1, 0.2, 0.25, 1 / 3)}
    assert by_poll[0.1] < by_poll[0.2] < by_poll[0.25] < by_poll[1 / 3]
    assert by_poll[0.1] == pytest.approx(0.0029, abs=0.0002)
    assert by_poll[0.2] == pytest.approx(0.0077, abs=0.0002)
    assert by_poll[0.25] == pytest.approx(0.0109, abs=0.0002)


def test_the_old_evenly_spaced_estimate_and_the_polled_one_agree_at_100_ms(loads):
    even = statistics.mean(clock_sampling_errors(loads["gemm"], 1.0, 10))
    assert mean_abs(polled_clock_errors(loads["gemm"], 1.0, 0.1)) == pytest.approx(even, abs=0.0002)


def test_a_bad_poll_period_is_refused(loads):
    with pytest.raises(UsageError, match="positive poll period"):
        polled_clock_errors(loads["gemm"], 1.0, 0.0)
