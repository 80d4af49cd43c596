"""Regression detection: a sustained drop of OFU against a job's (or GPU's) own baseline.

Per key, busy windows flow through two windows of values: the most recent
``confirm_windows`` (the suspect), and before them up to ``baseline_windows``
(the baseline). A regression is raised when the suspect's median falls below
``drop_ratio`` × the baseline's median, and cleared when it climbs back above
``recover_ratio`` × baseline. Medians ignore the odd slow window (noise,
a transition); windows where the GPU is idle (SM activity under
``idle_sm_active``: checkpointing, evaluation, data stalls between steps)
are skipped, so a pause is never read as a drop. While a regression is open,
values stop entering the baseline, so the baseline does not learn the slow state.

A stalled loop is *not* idle: the 2.5× slower loop recorded on the H200
(tests/data/h200-detector) still keeps 28 % of SMs busy, which is why the idle
cut is the bottleneck classifier's 5 % and not something higher.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable

from kernelfleet.ofu.bottleneck import IDLE_SM_ACTIVE


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # "regression" or "recovery"
    key: Hashable
    ts: float
    baseline_ofu: float
    current_ofu: float

    @property
    def ratio(self) -> float:
        return self.current_ofu / self.baseline_ofu if self.baseline_ofu else 0.0

    def describe(self) -> str:
        verb = "dropped" if self.kind == "regression" else "recovered"
        return (f"OFU of {_name(self.key)} {verb} to {self.current_ofu:.3f} from a baseline of "
                f"{self.baseline_ofu:.3f} ({self.ratio:.2f}x)")


def _name(key: Hashable) -> str:
    """("job", "train-7") -> "job train-7"; ("gpu", uuid, mig) -> "GPU uuid[/mig N]"."""
    if isinstance(key, tuple) and key and key[0] == "job":
        return f"job {key[1]}"
    if isinstance(key, tuple) and key and key[0] == "gpu":
        return f"GPU {key[1]}" + (f"/mig {key[2]}" if len(key) > 2 and key[2] is not None else "")
    return str(key)


@dataclass
class _State:
    recent: deque[float]
    baseline: deque[float]
    open: bool = False


@dataclass
class RegressionDetector:
    drop_ratio: float = 0.7
    recover_ratio: float = 0.9
    confirm_windows: int = 20
    baseline_windows: int = 600
    min_baseline_windows: int = 20
    idle_sm_active: float = IDLE_SM_ACTIVE
    _states: dict[Hashable, _State] = field(default_factory=dict, init=False)

    def observe(self, key: Hashable, ts: float, ofu: float | None, sm_active: float | None) -> Event | None:
        """Feed one window; returns an event when a regression opens or closes."""
        if ofu is None or sm_active is None or sm_active < self.idle_sm_active:
            return None
        state = self._states.setdefault(
            key, _State(deque(maxlen=self.confirm_windows), deque(maxlen=self.baseline_windows))
        )
        if len(state.recent) == state.recent.maxlen:
            leaving = state.recent[0]
            if not state.open:
                state.baseline.append(leaving)
        state.recent.append(ofu)
        if len(state.recent) < self.confirm_windows or len(state.baseline) < self.min_baseline_windows:
            return None
        base, now = statistics.median(state.baseline), statistics.median(state.recent)
        if not state.open and now < self.drop_ratio * base:
            state.open = True
            return Event("regression", key, ts, base, now)
        if state.open and now >= self.recover_ratio * base:
            state.open = False
            return Event("recovery", key, ts, base, now)
        return None
