"""Counter source on NVML: GPM metrics, dense SM clock, power, memory, health and processes.

GPM metrics are computed between two GPM samples, so the source keeps the last
sample of each GPU and MIG instance and yields one :class:`Sample` per window
(rolling pairs). Windows shorter than ~100 ms read as zeros on an H200, so the
interval is at least :data:`MIN_INTERVAL_SECONDS`. The metrics themselves are read by ``gpm.py``.
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from kernelfleet.errors import EnvironmentProblem, KernelfleetError, UsageError
from kernelfleet.telemetry.clock import CLOCK_POLL_SECONDS, ClockPoller, ClockWindow
from kernelfleet.telemetry.clock_events import FLOOD_RATIO, ClockEvents
from kernelfleet.telemetry.gpm import GpmMetrics
from kernelfleet.telemetry.health import SLOW_HEALTH_SECONDS, HealthReader
from kernelfleet.telemetry.nvml_api import REPLAY_HINT, Nvml, NvmlCallFailed, text
from kernelfleet.telemetry.nvml_hot import bind, clock_reader, read_optional
from kernelfleet.telemetry.nvml_target import Target, identity
from kernelfleet.telemetry.process_watch import PROCESS_LIST_MAX_AGE_SECONDS, ProcessWatch
from kernelfleet.telemetry.processes import process_lister
from kernelfleet.telemetry.sample import Sample

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 0.1
CLOCK_MODES = ("auto", "events", "poll")

@dataclass
class NvmlSource:
    """Rolling GPM windows over every GPU (and MIG instance) NVML can see.

    >>> with NvmlSource(interval_seconds=1.0) as source:  # doctest: +SKIP
    ...     for batch in source.batches(): ...
    """

    interval_seconds: float = 1.0
    clock_poll_seconds: float = CLOCK_POLL_SECONDS  # while a clock moves (telemetry/clock.py says why)
    # Poll densely only while some GPU's clock moved in the last window; while every clock holds
    # still (idle, or boosting steadily below the power cap), read once a window. A change is seen
    # late by at most one window, whose mean then rests on the read at its end.
    adaptive_clock_poll: bool = True
    # "poll" (the default) as above. "auto": sleep on clock-change events where every GPU offers them
    # (telemetry/clock_events.py), else poll (and poll when dense polling was asked for:
    # adaptive_clock_poll False, --dense-clock); "events" forces them. Not the default: an H200
    # (driver 580) sent 10 events a window with its clock still (6.3 ms of CPU a window against 0.61
    # polling) and, under load, 222 in 5 s for 30 changes, 10 of them unannounced (docs/telemetry.md).
    clock_mode: str = "poll"
    # The reads made every poll and every window call NVML's C functions directly
    # (telemetry/nvml_hot.py); False goes through pynvml's wrapper for each, as before.
    hot_reads: bool = True
    slow_health_seconds: float = SLOW_HEALTH_SECONDS  # temperature and ECC counts (health.py); 0: every window
    # The process list is read again when the used memory moved, on a shared GPU, or when it is this
    # old (telemetry/process_watch.py); 0: every window.
    process_list_max_age_seconds: float = PROCESS_LIST_MAX_AGE_SECONDS
    nvml: Nvml = field(default_factory=Nvml)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    proc_root: Path = Path("/proc")
    _targets: list[Target] = field(default_factory=list, init=False)
    _poller: ClockPoller | None = field(default=None, init=False)
    _events: ClockEvents | None = field(default=None, init=False)
    _warned: set[str] = field(default_factory=set, init=False)
    _handles: dict[int, Any] = field(default_factory=dict, init=False)
    _window_clocks: dict[int, ClockWindow] = field(default_factory=dict, init=False)
    _gpm: GpmMetrics = field(init=False)
    _health: HealthReader = field(init=False)

    def __post_init__(self) -> None:
        if self.clock_poll_seconds <= 0:
            raise UsageError(f"--clock-poll must be positive, got {self.clock_poll_seconds}")
        if self.interval_seconds < MIN_INTERVAL_SECONDS:
            raise UsageError(
                f"--interval must be at least {MIN_INTERVAL_SECONDS} s "
                f"(GPM windows shorter than that read as zeros), got {self.interval_seconds}"
            )
        if self.clock_mode not in CLOCK_MODES:
            raise UsageError(f"clock_mode must be one of {', '.join(CLOCK_MODES)}, got {self.clock_mode!r}")
        if self.slow_health_seconds < 0:
            raise UsageError(f"slow_health_seconds must be >= 0, got {self.slow_health_seconds}")
        if self.process_list_max_age_seconds < 0:
            raise UsageError(f"process_list_max_age_seconds must be >= 0, got {self.process_list_max_age_seconds}")
        self._health = HealthReader(self.nvml, self._warn_once, self.hot_reads, self.slow_health_seconds, self.clock)
        self._gpm = GpmMetrics(self.nvml, self._warn_once)

    # -- lifecycle -----------------------------------------------------------------
    def open(self) -> NvmlSource:
        self.nvml.init()
        self._discover()
        if not self._targets:
            self.nvml.shutdown()
            raise EnvironmentProblem(f"NVML found no GPU on this machine; {REPLAY_HINT}")
        self._poller = ClockPoller(self.clock)
        self._poller.watch(self._clock_readers())
        self._health.watch(self._whole_gpus())
        self._watch_clock_events()
        self._prime()
        return self

    def close(self) -> None:
        for target in self._targets:
            self._free(target)
        self._health.close()
        if self._events is not None:
            self._events.close()
        self.nvml.shutdown()

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------
    def batches(self, count: int | None = None) -> Iterator[list[Sample]]:
        """Yield one batch (a Sample per GPU/MIG instance) every interval.

        Between batches the loop either sleeps on clock-change events, reading a GPU's clock when
        it changes (``clock_path`` "events"), or wakes every ``clock_poll_seconds`` to read the SM
        clocks, so each window's mean clock rests on evenly spaced reads.
        """
        emitted = 0
        window_end = self.clock() + self.interval_seconds
        if self.clock_path == "events" and not self._window_clocks:
            self.poll_clocks()  # the value the first window starts from; events say when it changes
        while count is None or emitted < count:
            if self.clock_path == "events":
                self._events.until(window_end, self.clock, self.sleep, self._poller)  # type: ignore[union-attr]
                self.poll_clocks()  # every GPU at the window's end: the check that no change went unannounced
            else:
                self._poll_until(window_end)
            window_end += self.interval_seconds
            batch = self.read()
            if self.clock_path == "events":
                self._events.judge({i: self._window_clocks[i] for i in self._handles  # type: ignore[union-attr]
                                    if i in self._window_clocks})
            yield batch
            emitted += 1

    @property
    def clock_path(self) -> str:
        """How the SM clock is being read now: "events" or "poll"."""
        return "events" if self._events is not None and self._events.active else "poll"

    @property
    def process_lists_total(self) -> int:
        """Process lists made this NVML session, all targets (telemetry/process_watch.py)."""
        return sum(t.processes.lists_total for t in self._targets if t.processes is not None)

    @property
    def clock_events(self) -> ClockEvents | None:
        """The clock-change events (their counts, or why they are off); None when polling was asked for."""
        return self._events

    def _poll_until(self, window_end: float) -> None:
        """Poll the clocks through one window, the last read at its end."""
        # How densely to read is decided once a window; each wake-up is then one sleep to an
        # absolute deadline and one read of every GPU's clock (a wake-up is most of a read's
        # CPU in a VM: docs/telemetry.md).
        step = self.clock_poll_seconds if self._clocks_moving() else self.interval_seconds
        start, polls = window_end - self.interval_seconds, 0
        clock, sleep, poll = self.clock, self.sleep, self._poller.poll_once  # type: ignore[union-attr]
        now = clock()
        while True:
            # the next deadline after now: a loop held up (a slow frame of `watch`) skips the
            # reads it missed instead of making them back to back
            polls = max(polls + 1, int((now - start) / step) + 1)
            due = start + polls * step
            last = due > window_end - 1e-6  # the read at the window's end (to float rounding)
            due = window_end if last else due
            while due - now > 1e-6:
                sleep(due - now)
                now = clock()  # one clock read a wake-up: it times the reads and the next deadline
            poll(now)
            if last:
                break

    def read(self) -> list[Sample]:
        """Close the current window of every target and open the next one."""
        batch = [self._read_target(t) for t in self._targets]
        if any(t.failed for t in self._targets):
            # Re-initialise now, so the next window is a whole interval long.
            self._reinit()
        return batch

    def poll_clocks(self) -> None:
        """Read every GPU's SM clock once (``batches`` calls this between windows' ends)."""
        if self._poller is not None:
            self._poller.poll_once()

    # -- internals -----------------------------------------------------------------
    def _clocks_moving(self) -> bool:
        """Whether the loop should poll densely: not adaptive, no window yet, or a clock moved."""
        if not self.adaptive_clock_poll or len(self._window_clocks) < len(self._handles):
            return True
        return any(w.moved or w.reads == 0 for w in self._window_clocks.values())

    def _watch_clock_events(self) -> None:
        """Register every whole GPU for clock-change events, unless polling was asked for."""
        if self.clock_mode == "poll" or (self.clock_mode == "auto" and not self.adaptive_clock_poll):
            return
        if self._events is None:
            polls = math.ceil(self.interval_seconds / self.clock_poll_seconds)
            self._events = ClockEvents(self.nvml, direct=self.hot_reads, max_events_per_window=FLOOD_RATIO * polls,
                                       trust_misses=self.clock_mode == "auto")
        if not self._events.register({i: self._handles[i] for i in sorted(self._handles)}):
            if self.clock_mode == "events":
                self.close()
                raise EnvironmentProblem(f"clock_mode 'events': {self._events.off}")
            # the usual case (NVML documents clock events for Kepler only): not a warning
            log.info("SM clock: %s; polling every %s s", self._events.off, self.clock_poll_seconds)

    def _discover(self) -> None:
        call, m = self.nvml.call, self.nvml.m
        targets: list[Target] = []
        for index in range(call("nvmlDeviceGetCount")):
            handle = call("nvmlDeviceGetHandleByIndex", index)
            pci = self.nvml.optional("nvmlDeviceGetPciInfo", handle)
            max_mhz = self.nvml.optional("nvmlDeviceGetMaxClockInfo", handle, m.NVML_CLOCK_SM)
            gpu = Target(
                gpu_index=index,
                handle=handle,
                info_handle=handle,
                uuid=text(call("nvmlDeviceGetUUID", handle)),
                name=text(call("nvmlDeviceGetName", handle)),
                pci_device_id=(pci.pciDeviceId >> 16) if pci is not None else None,
                max_clock_hertz=max_mhz * 1e6 if max_mhz else None,
                gpm_supported=self._gpm_supported(handle),
            )
            targets.append(gpu)
            targets.extend(self._mig_targets(gpu))
        for target in targets:
            self._bind_reads(target)
        self._targets = targets

    def _gpm_supported(self, handle: Any) -> bool:
        support = self.nvml.optional("nvmlGpmQueryDeviceSupport", handle)
        return bool(support is not None and support.isSupportedDevice)

    def _mig_targets(self, gpu: Target) -> list[Target]:
        modes = self.nvml.optional("nvmlDeviceGetMigMode", gpu.handle)
        if not modes or modes[0] != getattr(self.nvml.m, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        slices = []
        for i in range(self.nvml.call("nvmlDeviceGetMaxMigDeviceCount", gpu.handle)):
            try:
                mig = self.nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, i)
            except NvmlCallFailed:
                continue  # an empty slot (NVML_ERROR_NOT_FOUND)
            slices.append(
                Target(
                    gpu_index=gpu.gpu_index,
                    handle=gpu.handle,
                    info_handle=mig,
                    uuid=text(self.nvml.call("nvmlDeviceGetUUID", mig)),
                    name=gpu.name,
                    pci_device_id=gpu.pci_device_id,
                    max_clock_hertz=gpu.max_clock_hertz,
                    mig_instance=self.nvml.call("nvmlDeviceGetGpuInstanceId", mig),
                    gpm_supported=gpu.gpm_supported,
                )
            )
        return slices

    def _clock_readers(self) -> dict[int, Callable[[], float]]:
        handles = {t.gpu_index: t.handle for t in self._targets if t.mig_instance is None}
        self._handles = handles
        return {index: clock_reader(self.nvml, handles[index], self.hot_reads) for index in sorted(handles)}

    def _whole_gpus(self) -> dict[str, Any]:
        return {t.uuid: t.handle for t in self._targets if t.mig_instance is None and not t.failed}

    def _bind_reads(self, target: Target) -> None:
        target.processes = ProcessWatch(self.nvml, target.info_handle,
                                        process_lister(self.nvml, target.info_handle, direct=self.hot_reads),
                                        self.proc_root, self.process_list_max_age_seconds)
        target.memory = bind(self.nvml, "nvmlDeviceGetMemoryInfo", (target.info_handle,), self.nvml.m.c_nvmlMemory_t,
                             direct=self.hot_reads)
        if target.mig_instance is None:
            target.power = bind(self.nvml, "nvmlDeviceGetPowerUsage", (target.handle,), ctypes.c_uint,
                                direct=self.hot_reads)

    def _prime(self) -> None:
        for target in self._targets:
            try:
                self._start_window(target)
            except NvmlCallFailed as exc:
                target.failed = str(exc)

    def _start_window(self, target: Target) -> None:
        target.failed = None
        target.previous_time = self.clock()
        target.previous_wall = self.wall()
        target.previous_process_timestamp = int(target.previous_wall * 1e6)
        target.previous = self._gpm_sample(target)

    def _gpm_sample(self, target: Target) -> Any:
        if not target.gpm_supported:
            return None
        sample, target.spare = target.spare, None
        if sample is None:
            sample = self.nvml.call("nvmlGpmSampleAlloc")
        try:
            if target.mig_instance is None:
                self.nvml.call("nvmlGpmSampleGet", target.handle, sample)
            else:
                self.nvml.call("nvmlGpmMigSampleGet", target.handle, target.mig_instance, sample)
        except KernelfleetError:
            self.nvml.call("nvmlGpmSampleFree", sample)
            raise
        return sample

    def _read_target(self, target: Target) -> Sample:
        if target.failed:
            return self._stale(target, target.failed, self.clock())
        start, prev_proc = target.previous_time, target.previous_process_timestamp
        try:
            current = self._gpm_sample(target)
            end, end_wall = self.clock(), self.wall()
            metrics = self._gpm.metrics(target.previous, current) if current is not None else {}
            memory = read_optional(target.memory)
            if memory is not None:
                memory = (int(memory.used), int(memory.total))  # the bound read reuses its structure
            # after the memory: a change in it is what makes the window list the processes again
            processes = target.processes.read(None if memory is None else memory[0], end,  # type: ignore[union-attr]
                                              prev_proc)
            # Board power is already a 1-s average on Ampere and newer (NVML docs), so one
            # read per window does; MIG slices have no power of their own.
            milliwatts = None if target.power is None else read_optional(target.power)
            health = self._health.read(target.uuid, target.handle) if target.mig_instance is None else {}
        except NvmlCallFailed as exc:
            target.failed = str(exc)
            log.warning("GPU %d: %s; re-initialising NVML", target.gpu_index, exc)
            return self._stale(target, str(exc), self.clock())
        target.spare, target.previous = target.previous, current
        target.previous_time, target.previous_wall = end, end_wall
        target.previous_process_timestamp = int(end_wall * 1e6)
        clock = self._clock_window(target, start, end)
        return Sample(
            timestamp_seconds=end_wall,
            window_seconds=end - start,
            **identity(target),
            sm_clock_mean_hertz=clock.mean if clock else None,
            sm_clock_instant_hertz=clock.last if clock else None,
            sm_clock_polls=clock.reads if clock else 0,
            power_mean_watts=None if milliwatts is None else milliwatts / 1000.0,
            memory_used_bytes=memory[0] if memory is not None else None,
            memory_total_bytes=memory[1] if memory is not None else None,
            processes=processes,
            **metrics,
            **health,
        )

    def _clock_window(self, target: Target, start: float, end: float) -> ClockWindow | None:
        """The SM clock over the window; MIG slices share their GPU's (read, not consumed)."""
        if self._poller is None:
            return None
        if target.mig_instance is None:
            self._window_clocks[target.gpu_index] = self._poller.take(target.gpu_index, start, end)
        return self._window_clocks.get(target.gpu_index)

    def _stale(self, target: Target, error: str, end: float) -> Sample:
        return Sample(
            timestamp_seconds=self.wall(),
            window_seconds=max(0.0, end - target.previous_time),
            stale=True,
            error=error,
            **identity(target),
        )

    def _reinit(self) -> None:
        """After an NVML failure: start NVML again and open fresh windows."""
        for target in self._targets:
            target.previous = target.spare = None  # buffers died with the old NVML session
        self._health.close()
        if self._events is not None:
            self._events.close()
        self.nvml.shutdown()
        try:
            self.nvml.init()
            old = {t.uuid: t for t in self._targets}
            self._discover()
        except KernelfleetError as exc:
            for target in self._targets:
                target.failed = f"NVML re-initialisation failed: {exc}"
            return
        # A GPU that vanished stays in the batch as stale so it is not silently dropped.
        seen = {t.uuid for t in self._targets}
        for uuid, target in old.items():
            if uuid not in seen:
                target.failed = "GPU no longer visible to NVML"
                self._targets.append(target)
        if self._poller is not None:
            self._poller.watch(self._clock_readers())
        self._health.watch(self._whole_gpus())
        if self._events is not None:
            self._events.register({i: self._handles[i] for i in sorted(self._handles)})
        self._prime()

    def _free(self, target: Target) -> None:
        for buffer in (target.previous, target.spare):
            if buffer is not None:
                try:
                    self.nvml.call("nvmlGpmSampleFree", buffer)
                except KernelfleetError:
                    pass  # freeing a buffer of a lost GPU; nothing else to do
        target.previous = target.spare = None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)
