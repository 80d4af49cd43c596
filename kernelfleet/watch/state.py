"""What the live view remembers between windows: OFU history, open regressions, sort and selection.

Pure: keys come in as names ("q", "s", "up", "down", "0".."9"), so the view's behaviour is tested
without a terminal (the terminal itself is tested through tmux, tests/e2e/test_watch_tmux.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.fleet.detect import RegressionDetector

HISTORY_WINDOWS = 120  # the widest sparkline a 200-column terminal shows, and then some
# name -> (key of a row, whether larger sorts first); missing values sort last
SORTS: dict[str, tuple[str, bool]] = {
    "gpu": ("gpu", False),
    "ofu": ("ofu_ratio", True),
    "memory": ("memory_used_bytes", True),
    "power": ("power_mean_watts", True),
}


def row_key(row: dict[str, Any]) -> str:
    """A GPU or MIG instance across windows (its UUID names it; the index can be reused)."""
    return row["uuid"]


@dataclass
class ViewState:
    sort: str = "gpu"
    selected: str | None = None  # row_key of the selected GPU; the first row when None
    detector: RegressionDetector = field(default_factory=RegressionDetector)
    history: dict[str, deque[float | None]] = field(default_factory=dict)
    regressions: set[str] = field(default_factory=set)  # row keys whose OFU regression is open

    def observe(self, rows: list[dict[str, Any]]) -> None:
        """Take one window: extend each GPU's OFU history and feed the regression detector."""
        for row in rows:
            key = row_key(row)
            self.history.setdefault(key, deque(maxlen=HISTORY_WINDOWS)).append(row["ofu_ratio"])
            event = self.detector.observe(key, row["timestamp_seconds"], row["ofu_ratio"], row["sm_active_ratio"])
            if event is not None:
                (self.regressions.add if event.kind == "regression" else self.regressions.discard)(key)

    def ordered(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` in the current sort order (ties and missing values by GPU index)."""
        field_name, descending = SORTS[self.sort]
        by_gpu = sorted(rows, key=lambda r: (r["gpu"], r["mig_instance"] or -1))
        known = [r for r in by_gpu if r[field_name] is not None]
        missing = [r for r in by_gpu if r[field_name] is None]
        return sorted(known, key=lambda r: r[field_name], reverse=descending) + missing

    def current(self, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The selected row, or the first in order when nothing (or a vanished GPU) is selected."""
        ordered = self.ordered(rows)
        chosen = [r for r in ordered if row_key(r) == self.selected]
        return chosen[0] if chosen else (ordered[0] if ordered else None)

    def press(self, key: str, rows: list[dict[str, Any]]) -> bool:
        """Apply one key; False when it asks to quit."""
        if key == "q":
            return False
        if key == "s":
            names = list(SORTS)
            self.sort = names[(names.index(self.sort) + 1) % len(names)]
        elif key in ("up", "down"):
            ordered = self.ordered(rows)
            if ordered:
                here = ordered.index(self.current(rows))  # type: ignore[arg-type]
                step = -1 if key == "up" else 1
                self.selected = row_key(ordered[max(0, min(len(ordered) - 1, here + step))])
        elif key.isdigit():
            matches = [r for r in self.ordered(rows) if r["gpu"] == int(key)]
            if matches:
                self.selected = row_key(matches[0])
        return True
