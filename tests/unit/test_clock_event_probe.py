"""The clock-event probe (bench/clock_event_probe.py) and the dense reference's window errors
(bench/clock_reference.py) on the NVML twin and on hand-made streams."""

import pytest
from nvml_twin import Twin, TwinGpu

from bench.clock_event_probe import (
    ClockEvent,
    ClockEventPhase,
    ClockEventRecording,
    coverage,
    describe,
    record_phase,
)
from bench.clock_reference import window_errors
from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.sample import Sample

pytestmark = pytest.mark.unit


def probe(fake_time, gpu, seconds=1.0):
    twin = Twin([gpu], fake_time.now, sleep=fake_time.sleep)
    nvml = Nvml(twin)
    nvml.init()
    return twin, record_phase(nvml, "load", seconds, clock=fake_time.now, sleep=fake_time.sleep)


def test_the_probe_records_every_event_beside_the_clock(fake_time):
    start = fake_time.now()
    steps = [(start + 0.1031, 1500), (start + 0.2031, 1455), (start + 0.5031, 1980)]
    twin, phase = probe(fake_time, TwinGpu(clock_mhz=1440, clock_trace=steps, clock_events=True))
    assert phase.registered and phase.error is None and twin.live_event_sets == 0
    assert [(round(e.time_seconds - start, 4), e.gpu, e.event_type, e.clock_mhz) for e in phase.events] == [
        (0.1031, 0, 0x10, 1500), (0.2031, 0, 0x10, 1455), (0.5031, 0, 0x10, 1980)]
    assert [m for _, m in phase.clock_changes[0]] == [1440, 1500, 1455, 1980]
    assert phase.clock_reads > 400  # a read after every return: ~2 ms apart
    c = coverage(phase)
    assert (c.events, c.clock_changes, c.announced, c.unexplained_events) == (3, 3, 3, 0)
    assert c.median_lag_seconds == pytest.approx(0.0)
    assert ClockEventPhase.model_validate_json(phase.model_dump_json()) == phase  # what DIR/clock_events.json holds


def test_a_driver_that_sends_no_events_shows_unannounced_changes(fake_time):
    start = fake_time.now()
    gpu = TwinGpu(clock_trace=[(start + 0.3, 1500), (start + 0.6, 1980)], clock_events=True,
                  delivers_clock_events=False)
    _, phase = probe(fake_time, gpu)
    c = coverage(phase)
    assert (c.events, c.clock_changes, c.announced, c.median_lag_seconds) == (0, 2, 0, None)


def test_a_gpu_without_clock_events_is_recorded_with_the_reason(fake_time):
    twin, phase = probe(fake_time, TwinGpu(clock_trace=[(fake_time.now() + 0.5, 1500)]))
    assert not phase.registered and "nvmlDeviceRegisterEvents(nvmlEventTypeClock)" in phase.error
    assert len(phase.clock_changes[0]) == 2 and twin.live_event_sets == 0  # the clock is still read
    recording = describe(Nvml(twin))
    assert recording == ClockEventRecording(driver="twin", gpus=["NVIDIA H200"], supported_event_types=["0xb"])


def test_coverage_matches_events_to_changes_within_five_ms():
    phase = ClockEventPhase(label="x", seconds=1, registered=True,
                            clock_changes=[[(0.0, 1400), (0.1, 1500), (0.2, 1455), (0.3, 1980)]],
                            events=[ClockEvent(time_seconds=t, gpu=0, event_type=0x10, event_data=0, clock_mhz=None)
                                    for t in (0.102, 0.204, 0.25)])
    c = coverage(phase)
    assert (c.announced, c.unexplained_events) == (2, 1)
    assert c.median_lag_seconds == pytest.approx(0.004)


def sample(end, seconds, mean_mhz, gpu=0):
    return Sample(timestamp_seconds=end, window_seconds=seconds, gpu_index=gpu, uuid="u", name="n",
                  sm_clock_mean_hertz=mean_mhz * 1e6)


def test_window_errors_against_the_dense_reference():
    reference = [[(9.0, 1400), (10.5, 1600), (12.0, 1600)]]
    errors = window_errors([sample(11.0, 1.0, 1500), sample(11.0, 1.0, 1400), sample(13.0, 1.0, 1500),
                            sample(11.0, 1.0, 1500, gpu=1)], reference)
    # [10, 11]: 1400 then 1600 from 10.5, mean 1500; the window ending at 13 outlasts the reference
    assert errors == pytest.approx([0.0, 100 / 1500])
