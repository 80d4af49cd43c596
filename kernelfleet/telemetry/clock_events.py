"""The SM clock read when it changes: NVML clock-change events instead of a poll every 100 ms.

Under the power cap an H200's SM clock moves only on a 100-ms grid (docs/telemetry.md), so a
polled window mean needs ten wake-ups a second, each ~60 µs of CPU in a VM before any work. A
driver that offers ``nvmlEventTypeClock`` (the H200's reports 0xff9f) can instead wake the
sampler when the clock changes: the sampler sleeps in ``nvmlEventSetWait`` until the window's
end, reads a GPU's clock when an event names it, and reads every GPU once more at the window's
end. The clock is a step function that changes only at events, so the window's mean over those
reads (``clock.step_mean``) is the polled mean without the reads that saw no change.

Whether the driver sends an event for every change is checked as the windows come: where events
announce every change, the window's end read equals the read before it (at the last event, or the
last window's end); one that differs saw a change nobody announced, or announced before the clock
had moved. ``MISSED_WINDOWS_LIMIT`` such windows in a row, or more events in a
window than polling would make wake-ups several times over, and :class:`ClockEvents` gives up
(logged once); the source then polls as before.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import KernelfleetError
from kernelfleet.telemetry.clock import ClockPoller, ClockWindow
from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.nvml_hot import Read, bind

log = logging.getLogger(__name__)

CLOCK_EVENT = 0x10  # nvmlEventTypeClock (nvml.h)
# Windows in a row with an unannounced change before the events are given up. One can be a change
# within an event's latency of the window's end read; three in a row is a driver that does not
# send them, or sends them early (under a power cap the clock moves every window).
MISSED_WINDOWS_LIMIT = 3
# More events a window than this many times the polls it replaces, and polling is cheaper.
FLOOD_RATIO = 4


def clock_events_offered(nvml: Nvml, handle: Any) -> bool:
    """Whether the GPU's driver lists clock-change events among its event types."""
    types = nvml.optional("nvmlDeviceGetSupportedEventTypes", handle)
    return bool(types is not None and types & CLOCK_EVENT)


def _address(handle: Any) -> int | None:
    """A handle's pointer value: what names the GPU in an event's ``device`` field."""
    return ctypes.cast(handle, ctypes.c_void_p).value


@dataclass
class ClockEvents:
    """One NVML event set holding every whole GPU's clock-change events (key -> handle).

    ``trust_misses=False`` (the source's ``clock_mode="events"``) keeps the events however many
    changes go unannounced: the benchmark measures the raw event path with it.
    """

    nvml: Nvml
    direct: bool = True
    max_events_per_window: int = 40
    trust_misses: bool = True
    off: str | None = None  # why events are not used (any more); None while they are
    events_total: int = 0
    wakes_total: int = 0  # returns from the event wait (an event, or the window's end)
    missed_windows_total: int = 0  # windows with a change no event announced
    _missed_in_a_row: int = 0
    _set: Any = None
    _wait: Read | None = None
    _keys: dict[int | None, object] = field(default_factory=dict)

    def register(self, handles: Mapping[object, Any]) -> bool:
        """Register every GPU for clock events; False (and ``off`` says why) where one cannot."""
        self.close()
        lacking = [key for key, handle in handles.items() if not clock_events_offered(self.nvml, handle)]
        if lacking or not handles:
            self.off = f"GPU {lacking[0] if lacking else '?'} offers no clock-change events"
            return False
        try:
            self._set = self.nvml.call("nvmlEventSetCreate")
            for handle in handles.values():
                self.nvml.call("nvmlDeviceRegisterEvents", handle, CLOCK_EVENT, self._set)
        except KernelfleetError as exc:
            self.close()
            self.off = f"clock-change events could not be registered ({exc})"
            return False
        timeout = getattr(self.nvml.m, "NVML_ERROR_TIMEOUT", 10)
        self._wait = bind(self.nvml, "nvmlEventSetWait_v2", (self._set,), self.nvml.m.c_nvmlEventData_t,
                          quiet=timeout, direct=self.direct)
        self._keys = {_address(handle): key for key, handle in handles.items()}
        self.off = None
        self._missed_in_a_row = 0
        return True

    @property
    def active(self) -> bool:
        return self._wait is not None and self.off is None

    def until(self, deadline: float, clock: Callable[[], float], sleep: Callable[[float], None],
              poller: ClockPoller) -> None:
        """Wait for clock events until ``deadline``, reading the clock of each GPU an event names.

        A failed wait (a lost GPU) sleeps out the window: the window's end read and the source's
        re-initialisation deal with the GPU, and the next window polls.
        """
        wait, keys, arrived = self._wait, self._keys, 0
        only = next(iter(keys.values())) if len(keys) == 1 else None  # one GPU: no need to look the device up
        while wait is not None and (left := deadline - clock()) > 1e-6:
            try:
                # whole milliseconds, rounded up: the window closes at most 1 ms late, never early
                event = wait(max(1, math.ceil(left * 1000 - 1e-6)))
            except KernelfleetError as exc:
                self._give_up(f"waiting for clock events failed ({exc})")
                break
            self.wakes_total += 1
            if event is None:
                continue  # the wait timed out: the window's end
            key = only if only is not None else keys.get(_address(event.device))
            poller.poll_one(key)
            arrived += 1
            if arrived > self.max_events_per_window:
                self._give_up(f"more than {self.max_events_per_window} clock events in a window")
                break
        self.events_total += arrived
        while (left := deadline - clock()) > 1e-6:
            sleep(left)

    def judge(self, windows: Mapping[object, ClockWindow]) -> None:
        """After a window: did some GPU's end read show a change its events had not?"""
        missed = any(w.last_moved for w in windows.values())
        self.missed_windows_total += missed
        self._missed_in_a_row = self._missed_in_a_row + 1 if missed else 0
        if self.trust_misses and self._missed_in_a_row >= MISSED_WINDOWS_LIMIT:
            self._give_up(f"{MISSED_WINDOWS_LIMIT} windows in a row saw a clock change with no event")

    def _give_up(self, why: str) -> None:
        self.off = why
        log.warning("SM clock: %s; polling the clock instead", why)

    def close(self) -> None:
        if self._set is not None:
            try:
                self.nvml.call("nvmlEventSetFree", self._set)
            except KernelfleetError:
                pass  # the set of a lost GPU; nothing else to free
        self._set, self._wait, self._keys = None, None, {}
