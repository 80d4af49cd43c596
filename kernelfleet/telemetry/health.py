"""Device health through the NVML doorway: memory total, temperature, clock-event (throttle)
reasons, ECC error counts and Xid events.

These are what operators already chart beside utilisation (nvidia-smi, dcgm-exporter). A GPU or
driver that lacks one gives ``None`` for it, logged once; never 0. They are whole-GPU values, so a
MIG slice reads none of them (its parent GPU's sample carries them).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import KernelfleetError
from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.nvml_hot import Read, bind, read_optional

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
ECC_CALL = "nvmlDeviceGetTotalEccErrors"


# Temperature and the ECC counts are read every this many seconds, not every window: a die's
# temperature moves over seconds (a thermal limit shows at once in the clock-event reasons, read
# every window), ECC counts change rarely and an uncorrectable error also raises an Xid event
# (drained every window); dcgm-exporter collects such fields every 30 s by default. Three NVML
# calls a window fewer; the values carried between reads are the last ones read, never filled in.
SLOW_HEALTH_SECONDS = 5.0


def clock_event_reasons(bitmask: int) -> list[str]:
    """The reason labels set in an NVML clock-event bitmask, in bit order."""
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if bitmask & bit]


@dataclass
class _GpuReads:
    """One whole GPU's health reads, bound once per NVML session."""

    temperature: Read
    reasons: Read | None
    ecc_corrected: Read
    ecc_uncorrected: Read
    slow: dict[str, Any] = field(default_factory=dict)  # the last slow fields read
    slow_at: float | None = None  # when they were read (None: not yet this session)


@dataclass
class HealthReader:
    """Reads the health fields of a whole GPU every window (temperature and ECC counts every
    ``slow_every_seconds``); keeps each GPU's Xid event set."""

    nvml: Nvml
    warn_once: Callable[[str, str], None]
    direct: bool = True  # bind the reads to NVML's C functions (telemetry/nvml_hot.py)
    slow_every_seconds: float = SLOW_HEALTH_SECONDS  # 0: every field every window
    clock: Callable[[], float] = time.monotonic
    _event_sets: dict[str, Any] = field(default_factory=dict, init=False)  # GPU uuid -> NVML event set
    _waits: dict[str, Read] = field(default_factory=dict, init=False)  # GPU uuid -> its event set's drain read
    _reads: dict[str, _GpuReads] = field(default_factory=dict, init=False)
    _xid_total: dict[str, int] = field(default_factory=dict, init=False)  # kept across NVML re-inits
    _xid_last: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        # pynvml renamed "throttle" reasons to "clocks event" reasons (driver 535); take either.
        m = self.nvml.m
        self._reasons_call = next((f for f in ("nvmlDeviceGetCurrentClocksEventReasons",
                                               "nvmlDeviceGetCurrentClocksThrottleReasons") if hasattr(m, f)), None)

    def watch(self, gpus: dict[str, Any]) -> None:
        """Bind each GPU's reads and register for its Xid events (uuid -> handle); forgets the
        reads and sets of a past NVML session."""
        self._event_sets, self._waits, self._reads = {}, {}, {}
        timeout = getattr(self.nvml.m, "NVML_ERROR_TIMEOUT", 10)
        for uuid, handle in gpus.items():
            self._reads[uuid] = self._bind(handle)
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
            # 0 ms: never blocks the window; TIMEOUT (no event left) is the usual answer
            self._waits[uuid] = bind(self.nvml, "nvmlEventSetWait_v2", (events,), self.nvml.m.c_nvmlEventData_t,
                                     (0,), quiet=timeout, direct=self.direct)
            self._xid_total.setdefault(uuid, 0)

    def _bind(self, handle: Any) -> _GpuReads:
        m = self.nvml.m

        def read(function: str, *args: Any, out: type = ctypes.c_uint) -> Read:
            return bind(self.nvml, function, (handle, *args), out, direct=self.direct)

        ecc = (m.NVML_VOLATILE_ECC,)
        return _GpuReads(
            temperature=read("nvmlDeviceGetTemperature", m.NVML_TEMPERATURE_GPU),
            reasons=read(self._reasons_call, out=ctypes.c_ulonglong) if self._reasons_call else None,
            ecc_corrected=read(ECC_CALL, m.NVML_MEMORY_ERROR_TYPE_CORRECTED, *ecc,
                               out=ctypes.c_ulonglong),
            ecc_uncorrected=read(ECC_CALL, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, *ecc,
                                 out=ctypes.c_ulonglong),
        )

    def close(self) -> None:
        for events in self._event_sets.values():
            try:
                self.nvml.call("nvmlEventSetFree", events)
            except KernelfleetError:
                pass  # the set of a lost GPU; nothing else to free
        self._event_sets, self._waits, self._reads = {}, {}, {}

    def read(self, uuid: str, handle: Any) -> dict[str, Any]:
        """The health fields of one whole GPU, as Sample keyword arguments.

        Raises :class:`NvmlCallFailed` like every other read of a window (the GPU is lost).
        """
        reads = self._reads.get(uuid)
        if reads is None:
            reads = self._reads[uuid] = self._bind(handle)
        reasons = self._optional("clock-events", self._reasons_call, reads.reasons) if reads.reasons else None
        now = self.clock()
        if reads.slow_at is None or now - reads.slow_at >= self.slow_every_seconds:
            temperature = self._optional("temperature", "nvmlDeviceGetTemperature", reads.temperature)
            reads.slow = {
                "temperature_celsius": None if temperature is None else float(temperature),
                # ECC off (or a GPU without it) answers NOT_SUPPORTED: None, not 0 errors.
                "ecc_corrected_errors_total": self._optional("ecc", ECC_CALL, reads.ecc_corrected),
                "ecc_uncorrected_errors_total": self._optional("ecc", ECC_CALL, reads.ecc_uncorrected),
            }
            reads.slow_at = now
        self._drain(uuid)
        return {
            **reads.slow,
            "clock_event_reasons_bitmask": reasons,
            "xid_errors_total": self._xid_total.get(uuid) if uuid in self._event_sets else None,
            "xid_last": self._xid_last.get(uuid),
        }

    def _drain(self, uuid: str) -> None:
        wait = self._waits.get(uuid)
        if wait is None:
            return
        for _ in range(XID_DRAIN_MAX):
            event = wait()
            if event is None:
                return  # no event left: the usual answer
            if event.eventType & XID_EVENT:
                self._xid_total[uuid] += 1
                self._xid_last[uuid] = int(event.eventData)

    def _optional(self, key: str, function: str, read: Read) -> int | None:
        value = read_optional(read)
        if value is None:
            self.warn_once(f"health-{key}", f"{function} is not supported on this GPU or driver; its field is None")
        return None if value is None else int(value)
