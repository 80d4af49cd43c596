"""The real-time serving loop: requests arrive, queue, and are served one graph launch at a time.

One thread in real time: requests arrive at given times; a FIFO queue; each turn admits what has
arrived, sleeps to the next arrival if nothing waits, picks the graph (fixed, or the online
monitor's choice, ``runtime/monitor.py``), takes one request (a one-slot graph) or up to its slots,
launches, waits for its outputs and stamps completion. A K-slot graph runs all K slots whatever the
queue holds: slots without a request are wasted work (``Run.slots_run``). After every launch the
served requests' outputs are checked; a request whose outputs are wrong is counted corrupted. When
the arrivals end the queue is drained, so every request is served once.

The loop takes its clock, sleep, launch and check as arguments (STYLE: time is passed in), so it
runs on the CPU with a simulated clock (tests/unit/test_serve.py); ``kernelfleet bench serve``
gives it the executor's graphs behind the gate and ``time.perf_counter``. Pure: no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kernelfleet.errors import UsageError
from kernelfleet.runtime.monitor import LATENCY, THROUGHPUT, Finished, Monitor


@dataclass(frozen=True, slots=True)
class Served:
    """One request: when it arrived, when the launch that served it began and ended, on which graph."""

    arrival_seconds: float
    launch_seconds: float
    done_seconds: float
    graph: str

    @property
    def latency_seconds(self) -> float:
        return self.done_seconds - self.arrival_seconds


@dataclass
class Run:
    """What one serving run did: every request served, launches by graph, slots launched (with a
    request or not), requests whose outputs were wrong, and the monitor's switches."""

    arrivals: int
    served: list[Served] = field(default_factory=list)
    launches: dict[str, int] = field(default_factory=dict)  # by graph
    slots_run: int = 0  # slots launched, with a request or not
    corrupted: int = 0
    switches: int | None = None  # the monitor's; None for a fixed graph


def serve(arrivals_seconds: Sequence[float], slots: dict[str, int], launch: Callable[[str, int], None],
          check: Callable[[str, int], int], now: Callable[[], float], sleep: Callable[[float], None], *,
          graph: str | None = None, monitor: Monitor | None = None) -> Run:
    """Serve requests arriving at ``arrivals_seconds`` (sorted, from the call) one launch at a time.

    ``slots[g]``: requests graph ``g`` serves per launch; ``launch(g, n)`` runs it for ``n`` queued
    requests and returns when its outputs are ready; ``check(g, n)``: how many of those ``n``
    requests' outputs are wrong. Either a fixed ``graph`` or a ``monitor`` picks the graph.
    """
    if (graph is None) == (monitor is None):
        raise UsageError("serve: give a fixed graph or a monitor, not both or neither")
    missing = ({graph} if monitor is None else {LATENCY, THROUGHPUT}) - set(slots)
    if missing:
        raise UsageError(f"serve: no graph for {', '.join(sorted(missing))}")
    run = Run(len(arrivals_seconds))
    queue: deque[float] = deque()
    start, admitted, woken = now(), 0, 0.0
    while admitted < len(arrivals_seconds) or queue:
        # a clock read after sleeping to an arrival may round to just before it: admit it anyway
        t = max(now() - start, woken)
        while admitted < len(arrivals_seconds) and arrivals_seconds[admitted] <= t:
            queue.append(arrivals_seconds[admitted])
            admitted += 1
        if not queue:
            sleep(arrivals_seconds[admitted] - t)
            woken = arrivals_seconds[admitted]
            continue
        chosen = graph if monitor is None else monitor.plan_for_next_step(t)
        batch = [queue.popleft() for _ in range(min(slots[chosen], len(queue)))]
        launched = max(now() - start, t)
        launch(chosen, len(batch))
        done = now() - start
        run.corrupted += check(chosen, len(batch))
        run.launches[chosen] = run.launches.get(chosen, 0) + 1
        run.slots_run += slots[chosen]
        for arrival in batch:
            run.served.append(Served(arrival, launched, done, chosen))
            if monitor is not None:
                monitor.finished(Finished(done, done - arrival, done - launched))
    if monitor is not None:
        run.switches = monitor.switches
    return run
