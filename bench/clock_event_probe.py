"""What a driver's clock-change events (nvmlEventTypeClock) say, against the clock read densely.

For a few seconds the probe sleeps in one NVML event set holding every GPU's clock events with a
2-ms timeout; after every return (an event, or the timeout) it reads every GPU's SM clock. So one
thread records both streams on one clock: each event (time, GPU, type, data, the clock read right
after it) and the clock itself every ~2 ms (only the reads that changed are kept). ``coverage``
then says how many clock changes an event announced, and how late. bench/sampler_cost.py runs the
probe idle and under load and writes the recording (``ClockEventRecording``) as JSON, to be
committed as test data; alone, on whatever the GPUs run now:

    python -m bench.clock_event_probe [--seconds 5] [--out FILE.json]
"""

from __future__ import annotations

import bisect
import ctypes
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench import Parser, command_line
from kernelfleet.errors import KernelfleetError
from kernelfleet.telemetry.clock_events import CLOCK_EVENT
from kernelfleet.telemetry.nvml_api import Nvml, text

WAIT_MS = 2
# An event this close to a change (either side) announces it: one 2-ms wait plus a read's time.
MATCH_SECONDS = 0.005


class ClockEvent(BaseModel):
    time_seconds: float  # time.monotonic() when the wait returned it
    gpu: int | None  # None: the event named a device the probe did not register
    event_type: int
    event_data: int
    clock_mhz: int | None  # the GPU's SM clock read right after


class ClockEventPhase(BaseModel):
    """One stretch of the probe (idle, or under load)."""

    label: str
    seconds: float
    registered: bool
    error: str | None = None  # why no events could be waited for
    events: list[ClockEvent] = []
    # per GPU, (time.monotonic(), MHz) at the start and at every read that differed from the one before
    clock_changes: list[list[tuple[float, int]]] = []
    clock_reads: int = 0  # reads made in all (most were unchanged and are not kept)


class ClockEventRecording(BaseModel):
    driver: str | None
    gpus: list[str]
    supported_event_types: list[str | None]  # per GPU, hex
    phases: list[ClockEventPhase] = []
    failures: list[str] = []  # a phase (or the benchmark's parts beside it) that failed, and why


class Coverage(BaseModel):
    """How well the events of a phase announce its clock changes."""

    label: str
    events: int
    clock_changes: int  # changes seen by the dense reads
    announced: int  # changes with an event of their GPU within MATCH_SECONDS
    unexplained_events: int  # events with no change of their GPU within MATCH_SECONDS
    median_lag_seconds: float | None  # event time - change time (negative: the event came first)


def describe(nvml: Nvml) -> ClockEventRecording:
    count = nvml.call("nvmlDeviceGetCount")
    handles = [nvml.call("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
    driver = nvml.optional("nvmlSystemGetDriverVersion")
    types = [nvml.optional("nvmlDeviceGetSupportedEventTypes", h) for h in handles]
    return ClockEventRecording(
        driver=None if driver is None else text(driver),
        gpus=[text(nvml.call("nvmlDeviceGetName", h)) for h in handles],
        supported_event_types=[None if t is None else hex(t) for t in types],
    )


def record_phase(nvml: Nvml, label: str, seconds: float, clock: Any = time.monotonic,
                 sleep: Any = time.sleep) -> ClockEventPhase:
    """Wait on every GPU's clock events for ``seconds``, reading the clocks after every return."""
    handles = [nvml.call("nvmlDeviceGetHandleByIndex", i) for i in range(nvml.call("nvmlDeviceGetCount"))]
    phase = ClockEventPhase(label=label, seconds=seconds, registered=False, clock_changes=[[] for _ in handles])
    keys = {ctypes.cast(h, ctypes.c_void_p).value: gpu for gpu, h in enumerate(handles)}
    sm = nvml.m.NVML_CLOCK_SM
    try:
        events = nvml.call("nvmlEventSetCreate")
    except KernelfleetError as exc:
        phase.error = f"nvmlEventSetCreate: {exc}"
        return phase
    try:
        for handle in handles:
            nvml.call("nvmlDeviceRegisterEvents", handle, CLOCK_EVENT, events)
        phase.registered = True
    except KernelfleetError as exc:
        phase.error = f"nvmlDeviceRegisterEvents(nvmlEventTypeClock): {exc}"
    timeout = getattr(nvml.m, "NVML_ERROR_TIMEOUT", 10)
    end = clock() + seconds
    try:
        while (now := clock()) < end:
            event = None
            if phase.registered:
                try:
                    event = nvml.call("nvmlEventSetWait_v2", events, WAIT_MS)
                except KernelfleetError as exc:
                    if getattr(exc, "code", None) != timeout:
                        phase.error = f"nvmlEventSetWait_v2: {exc}"
                        phase.registered = False
            else:
                sleep(WAIT_MS / 1000)
            now = clock()
            mhz = [nvml.optional("nvmlDeviceGetClockInfo", h, sm) for h in handles]
            phase.clock_reads += 1
            for gpu, value in enumerate(mhz):
                changes = phase.clock_changes[gpu]
                if value is not None and (not changes or changes[-1][1] != value):
                    changes.append((now, value))
            if event is not None:
                gpu = keys.get(ctypes.cast(event.device, ctypes.c_void_p).value)
                phase.events.append(ClockEvent(time_seconds=now, gpu=gpu, event_type=int(event.eventType),
                                               event_data=int(event.eventData),
                                               clock_mhz=None if gpu is None else mhz[gpu]))
    finally:
        nvml.call("nvmlEventSetFree", events)
    return phase


def coverage(phase: ClockEventPhase) -> Coverage:
    """Match the phase's clock changes (after each GPU's first read) with its events."""
    changes = [(t, gpu) for gpu, steps in enumerate(phase.clock_changes) for t, _ in steps[1:]]
    by_gpu: dict[int | None, list[float]] = {}
    for event in phase.events:
        by_gpu.setdefault(event.gpu, []).append(event.time_seconds)
    lags, announced = [], 0
    for t, gpu in changes:
        times = by_gpu.get(gpu, [])
        nearest = _nearest(times, t)
        if nearest is not None and abs(nearest - t) <= MATCH_SECONDS:
            announced += 1
            lags.append(nearest - t)
    change_times = {gpu: [t for t, _ in steps[1:]] for gpu, steps in enumerate(phase.clock_changes)}
    unexplained = sum(1 for e in phase.events
                      if (n := _nearest(change_times.get(e.gpu, []), e.time_seconds)) is None
                      or abs(n - e.time_seconds) > MATCH_SECONDS)
    lags.sort()
    return Coverage(label=phase.label, events=len(phase.events), clock_changes=len(changes), announced=announced,
                    unexplained_events=unexplained, median_lag_seconds=lags[len(lags) // 2] if lags else None)


def _nearest(times: list[float], t: float) -> float | None:
    i = bisect.bisect_left(times, t)
    near = [times[j] for j in (i - 1, i) if 0 <= j < len(times)]
    return min(near, key=lambda x: abs(x - t)) if near else None



def print_coverage(phase: ClockEventPhase) -> None:
    c = coverage(phase)
    lag = "-" if c.median_lag_seconds is None else f"{1000 * c.median_lag_seconds:+.1f} ms"
    print(f"clock-event probe, {phase.label}: {c.events} events, {c.clock_changes} clock changes in "
          f"{phase.clock_reads} reads, {c.announced} announced (median lag {lag}), {c.unexplained_events} events "
          "with no change" + (f"; {phase.error}" if phase.error else ""), flush=True)


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, help="write the recording here as JSON")
    args = parser.parse_args()
    print(f"command: {command_line()}")
    nvml = Nvml()
    nvml.init()
    try:
        recording = describe(nvml)
        recording.phases.append(record_phase(nvml, "now", args.seconds))
    finally:
        nvml.shutdown()
    print_coverage(recording.phases[0])
    if args.out is not None:
        args.out.write_text(recording.model_dump_json() + "\n")
    print(coverage(recording.phases[0]).model_dump_json())


if __name__ == "__main__":
    try:
        main()
    except KernelfleetError as exc:  # no NVML or no GPU here: one line
        sys.exit(f"clock_event_probe: {exc}")
