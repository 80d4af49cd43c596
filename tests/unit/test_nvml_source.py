"""NvmlSource's control flow on the NVML CPU twin: values, stale, re-init, MIG, no GPM."""

import pytest
from nvml_twin import Twin, TwinGpu

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml

pytestmark = pytest.mark.unit


def open_source(gpus, fake_time, **kw):
    twin = Twin(gpus, fake_time.now, **kw)
    source = NvmlSource(
        interval_seconds=1.0,
        nvml=Nvml(twin),
        clock=fake_time.now,
        wall=fake_time.wall,
        sleep=fake_time.sleep,
        clock_poll_seconds=0.1,  # the read counts below are on a 100-ms grid (the default is 0.25)
    )
    return twin, source


def tick(source, fake_time, clocks, gpu, seconds=1.0):
    """Advance one window, polling the clock at evenly spaced times with the given MHz values."""
    step = seconds / len(clocks)
    for mhz in clocks:
        fake_time.sleep(step)
        gpu.clock_mhz = mhz
        source.poll_clocks()
    return source.read()


def test_one_window_carries_recorded_h200_values(fake_time):
    gpu = TwinGpu(processes=[(4242, 1 << 30)], process_sm_percent={4242: 54})
    twin, source = open_source([gpu], fake_time)
    with source:
        (s,) = tick(source, fake_time, [1400, 1500, 1600, 1700], gpu)
    assert s.name == "NVIDIA H200" and s.pci_device_id == 0x2335
    assert s.tensor_active_ratio == pytest.approx(0.9363)
    assert s.dram_bandwidth_ratio == pytest.approx(0.1730)
    assert s.pcie_tx_bytes_per_second == pytest.approx(14.6 * 1024 * 1024)
    assert s.window_seconds == pytest.approx(1.0)
    # each read holds until the next; with no read before the window the first is
    # extended back: 1400 on [0, 0.5), 1500 on [0.5, 0.75), 1600 on [0.75, 1]
    assert s.sm_clock_mean_hertz == pytest.approx(1475e6)
    assert s.sm_clock_instant_hertz == 1700e6 and s.sm_clock_polls == 4
    assert s.sm_clock_max_hertz == 1980e6
    assert s.power_mean_watts == pytest.approx(691.0)
    # one process owns the GPU: its per-process SM share (a 2.4 ms call) is not read
    assert [(p.pid, p.used_memory_bytes, p.sm_active_ratio) for p in s.processes] == [(4242, 1 << 30, None)]
    assert not s.stale and s.gpm_supported
    assert twin.live_samples == 0  # every GPM buffer freed on close


def test_shared_gpu_reads_per_process_sm_share(fake_time):
    gpu = TwinGpu(processes=[(10, 1 << 30), (11, 2 << 30)], process_sm_percent={10: 60, 11: 25})
    _, source = open_source([gpu], fake_time)
    with source:
        (s,) = tick(source, fake_time, [1400], gpu)
    assert [(p.pid, p.sm_active_ratio) for p in s.processes] == [(10, 0.60), (11, 0.25)]


def test_clock_mean_carries_last_poll_into_next_window(fake_time):
    gpu = TwinGpu()
    _, source = open_source([gpu], fake_time)
    with source:
        tick(source, fake_time, [1000, 1000, 1000, 1800], gpu)
        # next window: one poll at 0.5 s of 1200; 1800 holds until then
        (s,) = tick(source, fake_time, [1200, 1200], gpu)
    assert s.sm_clock_mean_hertz == pytest.approx((1800 * 0.5 + 1200 * 0.5) * 1e6)


def test_lost_gpu_gives_stale_samples_then_recovers_after_reinit(fake_time):
    gpu = TwinGpu()
    twin, source = open_source([gpu], fake_time)
    with source:
        tick(source, fake_time, [1400], gpu)
        gpu.lost = True
        (stale,) = tick(source, fake_time, [1400], gpu)
        assert stale.stale and stale.tensor_active_ratio is None and stale.sm_clock_mean_hertz is None
        assert "nvmlGpmSampleGet failed" in stale.error and f"code {15}" in stale.error
        # re-initialisation was tried at once and failed (the GPU is still lost): still stale
        (still,) = tick(source, fake_time, [1400], gpu)
        assert still.stale and "re-initialisation failed" in still.error
        gpu.lost = False
        inits = twin.inits
        # this window was never opened, so it stays stale; NVML comes back at its end
        (recovering,) = tick(source, fake_time, [1400], gpu)
        assert recovering.stale and twin.inits == inits + 1
        (again,) = tick(source, fake_time, [1400], gpu)
    assert not again.stale and again.tensor_active_ratio == pytest.approx(0.9363)
    assert again.window_seconds == pytest.approx(1.0)


def test_gpu_without_gpm_is_reported_not_crashed(fake_time):
    t4 = TwinGpu(name="Tesla T4", uuid="GPU-t4", pci_device_id=0x1EB8, gpm=False, max_clock_mhz=1590)
    _, source = open_source([t4], fake_time)
    with source:
        (s,) = tick(source, fake_time, [1590], t4)
    assert not s.gpm_supported and not s.stale
    assert s.tensor_active_ratio is None and s.sm_active_ratio is None
    assert s.sm_clock_mean_hertz == 1590e6 and s.power_mean_watts is not None


def test_refused_metric_is_none_and_others_survive(fake_time):
    gpu = TwinGpu(refused_metrics={10})
    _, source = open_source([gpu], fake_time)
    with source:
        (s,) = tick(source, fake_time, [1400], gpu)
    assert s.dram_bandwidth_ratio is None
    assert s.tensor_active_ratio == pytest.approx(0.9363)


def test_mig_instances_are_reported_per_instance(fake_time):
    gpu = TwinGpu(mig_instances=[1, 2])
    twin, source = open_source([gpu], fake_time)
    with source:
        batch = tick(source, fake_time, [1400], gpu)
    assert [(s.gpu_index, s.mig_instance) for s in batch] == [(0, None), (0, 1), (0, 2)]
    assert batch[1].uuid == "MIG-GPU-twin-0-1"
    assert batch[1].power_mean_watts is None  # power belongs to the whole GPU
    assert batch[2].sm_clock_mean_hertz == 1400e6
    assert twin.live_samples == 0


def test_no_nvml_library_is_one_clear_line(fake_time):
    _, source = open_source([TwinGpu()], fake_time, library=False)
    with pytest.raises(EnvironmentProblem, match="libnvidia-ml.so was not found.*--replay"):
        source.open()


def test_no_gpu_is_one_clear_line(fake_time):
    _, source = open_source([], fake_time)
    with pytest.raises(EnvironmentProblem, match="no GPU.*--replay"):
        source.open()


def test_window_shorter_than_gpm_minimum_is_refused():
    with pytest.raises(UsageError, match="at least 0.1"):
        NvmlSource(interval_seconds=0.05)


def test_batches_pace_by_interval_and_read_the_clock_between(fake_time):
    gpu = TwinGpu()
    _, source = open_source([gpu], fake_time)
    source.adaptive_clock_poll = False
    with source:
        start = fake_time.now()
        batches = list(source.batches(count=3))
    assert len(batches) == 3
    assert fake_time.now() - start == pytest.approx(3.0)
    # dense: a read every 100 ms, the last one at the window's end
    assert [b[0].sm_clock_polls for b in batches] == [10, 10, 10]


def test_a_steady_clock_is_read_once_a_window_until_it_moves(fake_time):
    gpu = TwinGpu(clock_mhz=1980)
    _, source = open_source([gpu], fake_time)
    polls, means = [], []
    with source:
        for i, batch in enumerate(source.batches(count=6)):
            polls.append(batch[0].sm_clock_polls)
            means.append(batch[0].sm_clock_mean_hertz / 1e6)
            if i == 2:
                gpu.clock_mhz = 1400  # load arrives and the clock drops
    # the first window has nothing to go by: dense; then one read a window while the clock holds.
    # The window holding the drop sees it only in its single read at the end (late by one window),
    # so the next window is dense again, and the one after it, steady, is read once.
    assert polls == [10, 1, 1, 1, 10, 1]
    assert means == pytest.approx([1980, 1980, 1980, 1980, 1400, 1400])


def test_cycle_counters_are_recorded_raw_when_the_driver_has_them(fake_time):
    gpu = TwinGpu()
    gpu.gpm_values.update({248: 2.5e12, 250: 1.1e12})
    _, source = open_source([gpu], fake_time)
    with source:
        (s,) = tick(source, fake_time, [1400], gpu)
    assert (s.sm_cycles_elapsed_raw, s.mma_cycles_active_raw) == (2.5e12, 1.1e12)


def test_cycle_counters_answered_ride_in_the_metrics_call(fake_time):
    gpu = TwinGpu()
    gpu.gpm_values.update({248: 2.5e12, 250: 1.1e12})
    twin, source = open_source([gpu], fake_time)
    asked = []
    metrics_get = twin.nvmlGpmMetricsGet

    def counted(request):
        asked.append(sorted(m.metricId for m in request.metrics[:request.numMetrics]))
        return metrics_get(request)

    twin.nvmlGpmMetricsGet = counted
    with source:
        windows = [tick(source, fake_time, [1400], gpu)[0] for _ in range(3)]
    assert len(asked) == 3 and all(248 in ids and 250 in ids and 5 in ids for ids in asked)  # one call a window
    assert all(s.sm_cycles_elapsed_raw == 2.5e12 and s.tensor_active_ratio == pytest.approx(0.9363) for s in windows)


def test_a_driver_refusing_the_cycle_counters_costs_nothing_else(fake_time):
    gpu = TwinGpu(refuse_calls_with={248})
    _, source = open_source([gpu], fake_time)
    with source:
        (first,) = tick(source, fake_time, [1400], gpu)
        (second,) = tick(source, fake_time, [1400], gpu)
    for s in (first, second):
        assert not s.stale and s.tensor_active_ratio == pytest.approx(0.9363)
        assert s.sm_cycles_elapsed_raw is None
    assert source._gpm.cycle_counters is False  # asked once, then not again


def test_a_driver_answering_every_cycle_counter_with_an_error_is_not_asked_again(fake_time):
    gpu = TwinGpu(refused_metrics={248, 250})  # the H200's driver 580 answers both with code 2
    _, source = open_source([gpu], fake_time)
    with source:
        (first,) = tick(source, fake_time, [1400], gpu)
        assert source._gpm.cycle_counters is False
        gpu.refused_metrics = set()  # would answer now, but is not asked: one GPM call a window
        gpu.gpm_values.update({248: 2.5e12})
        (second,) = tick(source, fake_time, [1400], gpu)
    assert first.sm_cycles_elapsed_raw is None and second.sm_cycles_elapsed_raw is None
    assert second.tensor_active_ratio == pytest.approx(0.9363)


def test_one_cycle_counter_answered_keeps_them_asked(fake_time):
    gpu = TwinGpu(refused_metrics={250})
    gpu.gpm_values.update({248: 2.5e12})
    _, source = open_source([gpu], fake_time)
    with source:
        (s,) = tick(source, fake_time, [1400], gpu)
    assert source._gpm.cycle_counters is True
    assert (s.sm_cycles_elapsed_raw, s.mma_cycles_active_raw) == (2.5e12, None)


def test_health_fields_come_through_the_doorway(fake_time, caplog):
    gpu = TwinGpu(temperature_c=61, clock_event_reasons=0x4 | 0x20, ecc_errors=(3, 1))
    twin, source = open_source([gpu], fake_time)
    with source:
        (first,) = tick(source, fake_time, [1400], gpu)
        gpu.pending_xids = [79, 48]
        (second,) = tick(source, fake_time, [1400], gpu)
        (third,) = tick(source, fake_time, [1400], gpu)
    assert (first.memory_used_bytes, first.memory_total_bytes) == (1 << 30, 141 << 30)
    assert first.temperature_celsius == 61.0 and first.clock_event_reasons_bitmask == 0x24
    assert (first.ecc_corrected_errors_total, first.ecc_uncorrected_errors_total) == (3, 1)
    assert (first.xid_errors_total, first.xid_last) == (0, None)
    assert (second.xid_errors_total, second.xid_last) == (2, 48)
    assert (third.xid_errors_total, third.xid_last) == (2, 48)  # a count, not a rate
    assert twin.live_event_sets == 0 and not caplog.records


def test_unsupported_health_fields_are_none_and_logged_once(fake_time, caplog):
    gpu = TwinGpu(temperature_c=None, clock_event_reasons=None, ecc_errors=None, events=False)
    _, source = open_source([gpu], fake_time)
    with source:
        batches = [tick(source, fake_time, [1400], gpu) for _ in range(3)]
    (s,) = batches[-1]
    assert (s.temperature_celsius, s.clock_event_reasons_bitmask, s.xid_errors_total, s.xid_last) == (None,) * 4
    assert (s.ecc_corrected_errors_total, s.ecc_uncorrected_errors_total) == (None, None)
    assert s.tensor_active_ratio == pytest.approx(0.9363)  # the rest of the window is read
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4, messages  # temperature, clock events, ECC, Xid: once each, not per window
    assert any("nvmlDeviceGetTotalEccErrors is not supported" in m for m in messages)


def test_mig_slices_carry_no_whole_gpu_health(fake_time):
    gpu = TwinGpu(mig_instances=[1])
    _, source = open_source([gpu], fake_time)
    with source:
        whole, mig = tick(source, fake_time, [1400], gpu)
    assert whole.temperature_celsius == 52.0 and whole.xid_errors_total == 0
    assert mig.temperature_celsius is None and mig.xid_errors_total is None and mig.memory_total_bytes == 141 << 30


def test_xid_count_survives_a_lost_gpu(fake_time):
    gpu = TwinGpu(pending_xids=[79])
    twin, source = open_source([gpu], fake_time)
    with source:
        tick(source, fake_time, [1400], gpu)
        gpu.lost = True
        (stale,) = tick(source, fake_time, [1400], gpu)
        gpu.lost = False
        for _ in range(3):
            (back,) = tick(source, fake_time, [1400], gpu)
    assert stale.stale and stale.xid_errors_total is None
    assert not back.stale and (back.xid_errors_total, back.xid_last) == (1, 79)
    assert twin.live_event_sets == 0


def test_a_gpu_refusing_xid_events_leaves_no_event_set(fake_time):
    twin, source = open_source([TwinGpu(events=False)], fake_time)
    source.open()
    assert twin.live_event_sets == 0
    source.close()
