"""Device health through the NVML doorway: memory total, temperature, clock-event (throttle)
reasons, ECC error counts and Xid events.

These are what operators already chart beside utilisation (nvidia-smi, dcgm-exporter). A GPU or
driver that lacks one gives ``None`` for it, logged once; never 0. They are whole-GPU values, so a
MIG slice reads none of them (its parent GPU's sample carries them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import KernelfleetError
from kernelfleet.telemetry.nvml_api import Nvml, NvmlCallFailed

# nvmlClocksEventReason* bits (nvml.h) -> the reason label the exporter and `watch` show.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
# Xid events left in a set are drained at every window's end; a GPU in an Xid storm must not hold
# the sampling loop, so at most this many are read a window (the rest wait for the next one).
XID_DRAIN_MAX = 64


def clock_event_reasons(bitmask: int) -> list[str]:
    """The reason labels set in an NVML clock-event bitmask, in bit order."""
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if bitmask & bit]


@dataclass
class HealthReader:
    """Reads the health fields of a whole GPU once a window; keeps each GPU's Xid event set."""

    nvml: Nvml
    warn_once: Callable[[str, str], None]
    _event_sets: dict[str, Any] = field(default_factory=dict, init=False)  # GPU uuid -> NVML event set
    _xid_total: dict[str, int] = field(default_factory=dict, init=False)  # kept across NVML re-inits
    _xid_last: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        # pynvml renamed "throttle" reasons to "clocks event" reasons (driver 535); take either.
        m = self.nvml.m
        self._reasons_call = next((f for f in ("nvmlDeviceGetCurrentClocksEventReasons",
                                               "nvmlDeviceGetCurrentClocksThrottleReasons") if hasattr(m, f)), None)

    def watch(self, gpus: dict[str, Any]) -> None:
        """Register for Xid events on each GPU (uuid -> handle); forgets sets of a past NVML session."""
        self._event_sets = {}
        for uuid, handle in gpus.items():
            try:
                events = self.nvml.call("nvmlEventSetCreate")
            except KernelfleetError as exc:
                self.warn_once("xid", f"Xid events unavailable ({exc}); xid_errors_total is None")
                continue
            try:
                self.nvml.call("nvmlDeviceRegisterEvents", handle, XID_EVENT, events)
            except KernelfleetError as exc:
                self.nvml.call("nvmlEventSetFree", events)
                self.warn_once("xid", f"Xid events unavailable ({exc}); xid_errors_total is None")
                continue
            self._event_sets[uuid] = events
            self._xid_total.setdefault(uuid, 0)

    def close(self) -> None:
        for events in self._event_sets.values():
            try:
                self.nvml.call("nvmlEventSetFree", events)
            except KernelfleetError:
                pass  # the set of a lost GPU; nothing else to free
        self._event_sets = {}

    def read(self, uuid: str, handle: Any) -> dict[str, Any]:
        """The health fields of one whole GPU, as Sample keyword arguments.

        Raises :class:`NvmlCallFailed` like every other read of a window (the GPU is lost).
        """
        m = self.nvml.m
        temperature = self._optional("temperature", "nvmlDeviceGetTemperature", handle, m.NVML_TEMPERATURE_GPU)
        reasons = self._optional("clock-events", self._reasons_call, handle) if self._reasons_call else None
        corrected = self._ecc(handle, m.NVML_MEMORY_ERROR_TYPE_CORRECTED)
        uncorrected = self._ecc(handle, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        self._drain(uuid)
        return {
            "temperature_celsius": None if temperature is None else float(temperature),
            "clock_event_reasons_bitmask": None if reasons is None else int(reasons),
            "ecc_corrected_errors_total": corrected,
            "ecc_uncorrected_errors_total": uncorrected,
            "xid_errors_total": self._xid_total.get(uuid) if uuid in self._event_sets else None,
            "xid_last": self._xid_last.get(uuid),
        }

    def _ecc(self, handle: Any, kind: int) -> int | None:
        # ECC off (or a GPU without it) answers NOT_SUPPORTED: None, not 0 errors.
        value = self._optional("ecc", "nvmlDeviceGetTotalEccErrors", handle, kind, self.nvml.m.NVML_VOLATILE_ECC)
        return None if value is None else int(value)

    def _drain(self, uuid: str) -> None:
        events = self._event_sets.get(uuid)
        if events is None:
            return
        timeout = getattr(self.nvml.m, "NVML_ERROR_TIMEOUT", 10)
        for _ in range(XID_DRAIN_MAX):
            try:
                event = self.nvml.call("nvmlEventSetWait_v2", events, 0)  # 0 ms: never blocks the window
            except NvmlCallFailed as exc:
                if exc.code == timeout:
                    return  # no event left: the usual answer
                raise
            if event.eventType & XID_EVENT:
                self._xid_total[uuid] += 1
                self._xid_last[uuid] = int(event.eventData)

    def _optional(self, key: str, function: str, *args: Any) -> Any:
        value = self.nvml.optional(function, *args)
        if value is None:
            self.warn_once(f"health-{key}", f"{function} is not supported on this GPU or driver; its field is None")
        return value
