"""The event-driven SM clock path (telemetry/clock_events.py) on the NVML twin's clock trace: its
window mean is the polled mean, it reads only when the clock changes, and it falls back to
polling where events are not offered, not sent, or too many."""

import logging
import random

import pytest
from nvml_twin import Twin, TwinGpu

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml

pytestmark = pytest.mark.unit

WALL = 1_800_000_000.0  # FakeTime.wall's offset


def trace(start, windows, seed=7, offset=-1e-7, every=1):
    """An H200-like clock: a change at some points of a 100-ms grid (``offset`` from each point)."""
    rng = random.Random(seed)
    steps = [(start + k * 0.1 + offset, rng.choice([1440, 1455, 1500, 1545, 1560, 1980]))
             for k in range(1, windows * 10 + 1) if k % every == 0 and rng.random() < 0.6]
    return [(start, 1500), *steps]


def exact_mean(steps, start, end):
    """The trace's own time-weighted mean over [start, end] (independent of clock.step_mean)."""
    area = 0.0
    for i, (t, mhz) in enumerate(steps):
        nxt = steps[i + 1][0] if i + 1 < len(steps) else end
        lo, hi = max(t, start), min(nxt, end)
        area += mhz * max(0.0, hi - lo)
    return area / (end - start)


def run(fake_time, gpus, mode, windows=5, **kw):
    twin = Twin(gpus, fake_time.now, sleep=fake_time.sleep)
    # 100-ms polls: the grid the twin's trace changes on, and what the event mean is checked against
    source = NvmlSource(interval_seconds=1.0, nvml=Nvml(twin), clock=fake_time.now, wall=fake_time.wall,
                        sleep=fake_time.sleep, clock_mode=mode, **{"clock_poll_seconds": 0.1, **kw})
    with source:
        batches = list(source.batches(count=windows))
        path, events = source.clock_path, source.clock_events
    return twin, batches, path, events


def windows_of(batches, gpu=0):
    """(start, end, mean MHz, reads) of one GPU's windows, on the twin's monotonic time."""
    out = []
    for batch in batches:
        s = batch[gpu]
        end = s.timestamp_seconds - WALL
        out.append((end - s.window_seconds, end, s.sm_clock_mean_hertz / 1e6, s.sm_clock_polls))
    return out


def test_event_mean_equals_the_polled_mean_on_the_trace(fake_time):
    steps = trace(fake_time.now(), 5)
    start = fake_time.now()
    _, polled, poll_path, _ = run(fake_time, [TwinGpu(clock_trace=steps, clock_events=True)], "poll")
    fake_time.t = start
    twin, evented, event_path, events = run(fake_time, [TwinGpu(clock_trace=steps, clock_events=True)], "auto")
    assert (poll_path, event_path) == ("poll", "events")
    for i, ((p0, p1, p_mean, p_reads), (e0, e1, e_mean, e_reads)) in enumerate(
            zip(windows_of(polled), windows_of(evented))):
        # changes fall just before each poll, so the polled mean is exact (but in the first window,
        # which has no read before its first poll); the events' is exact in every window
        assert e_mean == pytest.approx(exact_mean(steps, e0, e1), rel=1e-6)
        # a read per change and one at the end (and, in the first window, one at its start)
        assert e_reads == sum(1 for t, _ in steps if e0 < t <= e1) + 1 + (i == 0)
        if i == 0:
            continue
        assert p_mean == pytest.approx(exact_mean(steps, p0, p1), rel=1e-6)
        assert e_mean == pytest.approx(p_mean, rel=4e-4)  # window ends differ by under 1 ms
        assert p_reads == 10
    changes = sum(1 for t, _ in steps if start < t < windows_of(evented)[-1][1])
    assert events.events_total == changes < 10 * 5 and events.missed_windows_total == 0
    assert twin.live_event_sets == 0


def test_events_place_changes_off_the_poll_grid_exactly(fake_time):
    # changes 37 ms after each grid point: a 100-ms poll sees each one late, an event does not
    steps = trace(fake_time.now(), 4, seed=3, offset=0.037)
    start = fake_time.now()
    _, polled, _, _ = run(fake_time, [TwinGpu(clock_trace=steps, clock_events=True)], "poll", windows=4)
    fake_time.t = start
    _, evented, _, _ = run(fake_time, [TwinGpu(clock_trace=steps, clock_events=True)], "events", windows=4)
    poll_errors = [abs(m - exact_mean(steps, a, b)) for a, b, m, _ in windows_of(polled)]
    for a, b, mean, _ in windows_of(evented):
        assert mean == pytest.approx(exact_mean(steps, a, b), rel=1e-6)
    assert max(poll_errors) > 1.0  # MHz


def test_a_steady_clock_costs_one_read_a_window(fake_time):
    _, batches, path, events = run(fake_time, [TwinGpu(clock_mhz=1980, clock_events=True)], "auto", windows=3)
    assert path == "events" and events.events_total == 0
    assert [b[0].sm_clock_polls for b in batches] == [2, 1, 1]  # the first also has the read at the start
    assert [b[0].sm_clock_mean_hertz for b in batches] == [1980e6] * 3


def test_an_event_reads_only_the_gpu_it_names(fake_time):
    moving = TwinGpu(clock_trace=trace(fake_time.now(), 2), clock_events=True)
    steady = TwinGpu(uuid="GPU-twin-1", clock_mhz=1980, clock_events=True)
    _, batches, _, events = run(fake_time, [moving, steady], "auto", windows=2)
    assert events.events_total > 4
    assert [b[1].sm_clock_polls for b in batches] == [2, 1]
    assert [b[0].sm_clock_polls for b in batches] == [r for *_, r in windows_of(batches)]
    assert batches[1][0].sm_clock_polls > 1


def test_auto_polls_where_no_gpu_offers_clock_events(fake_time, caplog):
    with caplog.at_level(logging.INFO):
        twin, batches, path, events = run(fake_time, [TwinGpu()], "auto", windows=2)
    assert path == "poll" and "offers no clock-change events" in events.off
    assert [b[0].sm_clock_polls for b in batches] == [10, 1]  # today's adaptive polling
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert twin.live_event_sets == 0


def test_dense_polling_asked_for_is_dense_polling(fake_time):
    # `--dense-clock` (adaptive_clock_poll False) reads every 100 ms even where events are offered
    _, batches, path, events = run(fake_time, [TwinGpu(clock_mhz=1980, clock_events=True)], "auto", windows=2,
                                   adaptive_clock_poll=False)
    assert path == "poll" and events is None
    assert [b[0].sm_clock_polls for b in batches] == [10, 10]


def test_forcing_events_where_none_are_offered_is_one_line(fake_time):
    twin = Twin([TwinGpu()], fake_time.now)
    source = NvmlSource(nvml=Nvml(twin), clock=fake_time.now, sleep=fake_time.sleep, clock_mode="events")
    with pytest.raises(EnvironmentProblem, match="^clock_mode 'events': GPU 0 offers no clock-change events$"):
        source.open()
    assert twin.live_event_sets == 0 and twin.live_samples == 0
    with pytest.raises(UsageError, match="clock_mode must be one of auto, events, poll, got 'sometimes'"):
        NvmlSource(clock_mode="sometimes")


def test_events_that_never_come_fall_back_to_polling(fake_time, caplog):
    mid_windows = [(fake_time.now() + w + 0.5, 1440 + 60 * (w % 2)) for w in range(6)]
    # the clock moves every window, no event is sent
    silent = {"clock_trace": mid_windows, "clock_events": True, "delivers_clock_events": False}
    start = fake_time.now()
    _, batches, path, events = run(fake_time, [TwinGpu(**silent)], "auto", windows=6)
    assert path == "poll" and "3 windows in a row" in events.off
    assert [b[0].sm_clock_polls for b in batches][:3] == [2, 1, 1]  # end reads only, then polling
    assert [b[0].sm_clock_polls for b in batches][3:] == [10, 10, 10]
    assert sum("polling the clock instead" in r.getMessage() for r in caplog.records) == 1
    fake_time.t = start
    _, _, forced_path, forced = run(fake_time, [TwinGpu(**silent)], "events", windows=6)
    assert forced_path == "events" and forced.missed_windows_total == 6  # forced: counted, kept


def test_events_sent_before_the_clock_moves_fall_back_to_polling(fake_time):
    # each event comes 5 ms early: the read it wakes sees the old clock, the end read the new one
    mid_windows = [(fake_time.now() + w + 0.5, 1440 + 60 * (w % 2)) for w in range(6)]
    gpu = TwinGpu(clock_trace=mid_windows, clock_events=True, clock_event_delay_seconds=-0.005)
    _, batches, path, events = run(fake_time, [gpu], "auto", windows=5)
    assert path == "poll" and "3 windows in a row" in events.off and events.events_total == 3
    assert [b[0].sm_clock_polls for b in batches][3:] == [10, 10]


def test_a_change_at_the_end_read_alone_keeps_the_events(fake_time):
    # events come 1 ms late; one change falls within that of a window's end, so its end read sees
    # it before its event does (in flight): one miss, not three in a row
    start = fake_time.now()
    steps = [(start + 0.3, 1500), (start + 0.9995, 1980), (start + 1.5, 1455), (start + 2.5, 1500)]
    gpu = TwinGpu(clock_trace=steps, clock_events=True, clock_event_delay_seconds=0.001)
    _, _, path, events = run(fake_time, [gpu], "auto", windows=3)
    assert path == "events" and events.missed_windows_total == 1


def test_a_flood_of_events_falls_back_to_polling(fake_time):
    flood = [(fake_time.now() + k * 0.001, 1400 + k % 2) for k in range(1, 3000)]
    _, batches, path, events = run(fake_time, [TwinGpu(clock_trace=flood, clock_events=True)], "auto", windows=2)
    assert path == "poll" and "more than 40 clock events" in events.off
    assert batches[0][0].window_seconds == pytest.approx(1.0, abs=2e-3)  # the window still ends on time
    assert batches[1][0].sm_clock_polls == 10


def test_a_lost_gpu_registers_its_events_again(fake_time):
    gpu = TwinGpu(clock_trace=trace(fake_time.now(), 6), clock_events=True)
    twin = Twin([gpu], fake_time.now, sleep=fake_time.sleep)
    source = NvmlSource(nvml=Nvml(twin), clock=fake_time.now, wall=fake_time.wall, sleep=fake_time.sleep,
                         clock_mode="auto")
    with source:
        stream = source.batches(count=5)
        next(stream)
        gpu.lost = True
        stale = next(stream)[0]
        gpu.lost = False
        rest = [next(stream)[0] for _ in range(3)]
        assert source.clock_path == "events" and twin.live_event_sets == 2  # Xid and clock sets
    assert stale.stale and not rest[-1].stale and rest[-1].sm_clock_mean_hertz is not None
    assert twin.live_event_sets == 0
