"""The online monitor under simulated Poisson load: light load keeps the latency plan, heavy load
moves to the throughput plan, every request is served exactly once, switches are counted."""

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.runtime.monitor import LATENCY, THROUGHPUT, Finished, Monitor
from kernelfleet.workloads.requests import fixed, poisson_requests

pytestmark = pytest.mark.unit

# The latency plan serves one request at a time in 10 ms; the throughput plan starts one every
# 6 ms (several in flight) and each takes 14 ms.
LATENCY_SERVICE, THROUGHPUT_INTERVAL, THROUGHPUT_LATENCY = 0.010, 0.006, 0.014


def serve(arrivals, monitor):
    """Discrete-event FIFO server that asks the monitor for the plan before each request."""
    free_at, served, plans = 0.0, [], []
    for i, arrival in enumerate(arrivals):
        start = max(arrival, free_at)
        plan = monitor.plan_for_next_step(start)
        if plan == LATENCY:
            done, free_at, execution = start + LATENCY_SERVICE, start + LATENCY_SERVICE, LATENCY_SERVICE
        else:
            done, free_at, execution = start + THROUGHPUT_LATENCY, start + THROUGHPUT_INTERVAL, THROUGHPUT_LATENCY
        monitor.finished(Finished(done, done - arrival, execution))
        served.append(i)
        plans.append(plan)
    return served, plans


def arrivals(rate, n, seed=0, offset=0.0):
    return [offset + r.arrival_seconds for r in poisson_requests(rate, n, fixed(8), fixed(4), 100, seed=seed)]


def test_light_load_stays_on_the_latency_plan():
    monitor = Monitor()
    served, plans = serve(arrivals(30.0, 600), monitor)
    assert served == list(range(600)) and set(plans) == {LATENCY} and monitor.switches == 0


def test_heavy_load_moves_to_the_throughput_plan_once():
    monitor = Monitor(latency_capacity=1 / LATENCY_SERVICE)
    served, plans = serve(arrivals(140.0, 3000), monitor)
    assert served == list(range(3000))
    assert plans[-1] == THROUGHPUT and plans.count(THROUGHPUT) > 0.9 * len(plans)
    assert monitor.switches == 1


def test_load_that_rises_and_falls_switches_both_ways():
    light1 = arrivals(30.0, 300, seed=1)
    heavy = arrivals(140.0, 1500, seed=2, offset=light1[-1])
    light2 = arrivals(30.0, 600, seed=3, offset=heavy[-1] + 1.0)
    monitor = Monitor(latency_capacity=1 / LATENCY_SERVICE)
    served, plans = serve(light1 + heavy + light2, monitor)
    assert served == list(range(len(plans)))
    assert plans[0] == LATENCY and THROUGHPUT in plans and plans[-1] == LATENCY
    assert monitor.switches == 2


def test_the_decision_waits_for_a_full_window():
    monitor = Monitor(window_seconds=0.3, beta=1.5, patience=1)  # Tessera's rule as published
    assert monitor.plan_for_next_step(0.0) == LATENCY
    monitor.finished(Finished(0.1, latency_seconds=0.05, execution_seconds=0.01))  # ratio 5
    assert monitor.plan_for_next_step(0.2) == LATENCY  # inside the first window
    assert monitor.plan_for_next_step(0.31) == THROUGHPUT
    assert monitor.ratio(10.0) is None  # nothing finished in the last window


def test_without_the_capacity_guard_heavy_load_flaps():
    monitor = Monitor()
    serve(arrivals(140.0, 3000), monitor)
    assert monitor.switches > 2  # why latency_capacity exists


def test_patience_needs_consecutive_windows():
    monitor = Monitor(window_seconds=0.3, beta=1.5, patience=2)
    monitor.plan_for_next_step(0.0)
    monitor.finished(Finished(0.1, 0.05, 0.01))
    assert monitor.plan_for_next_step(0.31) == LATENCY  # one window wanted throughput
    monitor.finished(Finished(0.5, 0.05, 0.01))
    assert monitor.plan_for_next_step(0.62) == THROUGHPUT and monitor.switches == 1


def test_bad_settings():
    for kwargs in ({"window_seconds": 0}, {"beta": -1}, {"start": "fastest"}, {"patience": 0}):
        with pytest.raises(UsageError):
            Monitor(**kwargs)
