"""The online monitor: when to run the latency plan and when the throughput plan.

Tessera's rule (PAPERS.md, section B): over windows of W = 300 ms, compare the mean latency of
the requests that finished (arrival to completion, so queueing included) with the mean time their
execution took. A ratio at or above beta = 1.5 means requests wait: the system is loaded and the
throughput plan, which serves more requests per second, should run. Below it requests barely queue
and the latency plan, which finishes each one sooner, should.

Two guards against flapping, neither in Tessera's rule as published (``patience=1``, no
``latency_capacity``): with about ten requests a window, one burst of Poisson arrivals lifts a
window's ratio past beta at light load, so a switch needs ``patience`` consecutive windows that
agree (default 2); and under the throughput plan requests queue less than the latency plan would
let them, so the ratio can dip below beta at a load the latency plan cannot carry. Given the
latency plan's capacity (requests/s), the monitor therefore does not switch back while the
completion rate, over the last ``rate_seconds`` (default 2 s), exceeds the utilisation at which the
latency plan would itself show a ratio of beta: with Poisson arrivals and a fixed service time
(M/D/1) latency / execution = 1 + rho / (2 (1 - rho)), which is beta at rho = 2 (beta - 1) /
(2 beta - 1), half its capacity for beta = 1.5. (The rate spans seconds, not one window, because a
K-slot throughput graph finishes K requests at once: one 300-ms window reads 0 or 10 requests/s at
3/s. With one window and a 90 % threshold the monitor flapped 14-25 times a minute at 3-6 req/s in
tests/unit/test_serve.py's simulation of the H200 graphs; now 0-12, and once at 6 req/s and above.)

The monitor only decides; the executor asks :meth:`Monitor.plan_for_next_step` between steps, so a
switch never interrupts a step and no request is dropped or split across plans. Pure: times come
in as arguments.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kernelfleet.errors import UsageError

LATENCY, THROUGHPUT = "latency", "throughput"


@dataclass(frozen=True, slots=True)
class Finished:
    at_seconds: float  # completion time
    latency_seconds: float  # completion - arrival
    execution_seconds: float  # time spent executing (no queueing)


class Monitor:
    """Windowed latency / execution ratio with threshold ``beta``; counts switches."""

    def __init__(self, window_seconds: float = 0.3, beta: float = 1.5, start: str = LATENCY,
                 patience: int = 2, latency_capacity: float | None = None, rate_seconds: float = 2.0) -> None:
        if window_seconds <= 0 or beta <= 0 or patience < 1:
            raise UsageError(f"monitor: window and beta must be positive and patience >= 1, got "
                             f"{window_seconds}, {beta}, {patience}")
        if start not in (LATENCY, THROUGHPUT):
            raise UsageError(f"monitor: start with {LATENCY!r} or {THROUGHPUT!r}, got {start!r}")
        self.window_seconds, self.beta = window_seconds, beta
        self.policy = start
        self.switches = 0
        self.patience = patience
        self.latency_capacity = latency_capacity
        self.rate_seconds = max(rate_seconds, window_seconds)
        # M/D/1: latency / execution = 1 + rho / (2 (1 - rho)) reaches beta at rho = 2 (beta - 1) / (2 beta - 1)
        self.return_utilization = min(0.9, 2 * (beta - 1) / (2 * beta - 1)) if beta > 1 else 0.0
        self._completions: deque[float] = deque()  # completion times over rate_seconds, for the guard
        self._agreeing = 0  # consecutive windows that wanted the other plan
        self._recent: deque[Finished] = deque()
        self._window_end: float | None = None

    def finished(self, request: Finished) -> None:
        """Record a completed request."""
        self._recent.append(request)
        self._completions.append(request.at_seconds)

    def ratio(self, now: float) -> float | None:
        """Mean latency over mean execution time of the requests finished in the last window."""
        while self._recent and self._recent[0].at_seconds < now - self.window_seconds:
            self._recent.popleft()
        if not self._recent:
            return None
        execution = sum(r.execution_seconds for r in self._recent)
        return sum(r.latency_seconds for r in self._recent) / execution if execution > 0 else None

    def plan_for_next_step(self, now: float) -> str:
        """The plan the next step runs under. Decided once per window, between steps."""
        if self._window_end is None:
            self._window_end = now + self.window_seconds
        if now >= self._window_end:
            self._window_end = now + self.window_seconds
            ratio = self.ratio(now)
            wanted = self.policy if ratio is None else THROUGHPUT if ratio >= self.beta else LATENCY
            while self._completions and self._completions[0] < now - self.rate_seconds:
                self._completions.popleft()
            rate = len(self._completions) / self.rate_seconds
            if wanted == LATENCY and self.latency_capacity is not None and rate > self.return_utilization * self.latency_capacity:
                wanted = THROUGHPUT  # the latency plan could not carry this load
            self._agreeing = self._agreeing + 1 if wanted != self.policy else 0
            if self._agreeing >= self.patience:
                self.policy, self._agreeing = wanted, 0
                self.switches += 1
        return self.policy
