"""A CPU twin of the pynvml functions NvmlSource calls (STYLE.md: every hardware
interface gets a CPU twin that runs the same control flow).

Values come from a recorded H200 window; tests script what real hardware cannot
be made to do on demand: a GPU that is lost mid-run, a GPU without GPM, MIG
slices, a metric the driver refuses. The GPM request struct is pynvml's own.

The reads telemetry/nvml_hot.py binds to NVML's C functions have a C side here too
(``_nvmlGetFunctionPointer``, as pynvml has): ctypes callbacks with NVML's signatures that
return the status and write the out-param, over the same Python functions. Handles and
event sets are ctypes pointers (``TwinHandle``) so they cross that C boundary.
"""

from __future__ import annotations

import bisect
import ctypes
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Self

import pynvml

NVML_SUCCESS = pynvml.NVML_SUCCESS
NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
XID_EVENT, CLOCK_EVENT = 0x8, 0x10  # nvmlEventTypeXidCriticalError, nvmlEventTypeClock
NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE: a process whose memory NVML cannot tell
DRIVER_RESERVED_BYTES = 531 << 20  # an idle H200's used memory (memory_follows_processes)


def _time(item: tuple[float, Any]) -> float:
    return item[0]


class MetricsRequest:
    """Stands in for pynvml.c_nvmlGpmMetricsGet_t (whose sample fields need real buffers)."""

    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(32)]


class NVMLError(pynvml.NVMLError):
    """pynvml's error class (so pynvml's own wrappers and the twin raise one kind), with the
    twin's own text and none of pynvml's per-code subclasses."""

    def __new__(cls, value: int) -> Self:
        error = Exception.__new__(cls)
        error.value = value
        return error

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")

    def __str__(self) -> str:
        return f"NVML error {self.value}"


# GPM metric values (percent or MiB/s) of a bf16 8192^3 GEMM window recorded on an H200
# (tests/data/h200/h200-bf16-gemm.jsonl.gz, line 4).
H200_GEMM_GPM = {5: 93.63, 7: 93.63, 9: 0.0, 6: 0.0, 2: 96.46, 3: 12.5, 10: 17.30, 13: 0.0, 12: 0.01,
                 11: 0.0, 4: 0.46, 20: 14.6, 21: 12.3, 61: 0.0, 60: 0.0}


@dataclass
class TwinGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-twin-0"
    pci_device_id: int = 0x2335
    max_clock_mhz: int = 1980
    clock_mhz: int = 1446
    gpm: bool = True
    gpm_values: dict[int, float] = field(default_factory=lambda: dict(H200_GEMM_GPM))
    refused_metrics: set[int] = field(default_factory=set)
    refuse_calls_with: set[int] = field(default_factory=set)  # a whole nvmlGpmMetricsGet fails if it asks for one
    power_watts: float = 691.0
    mig_instances: list[int] = field(default_factory=list)  # GPU instance ids
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    # used memory: 1 GiB whatever runs, or (True) what the driver holds plus every listed process's
    # bytes, as on a GPU, where a process cannot come or go without its memory showing
    memory_follows_processes: bool = False
    process_sm_percent: dict[int, int] = field(default_factory=dict)
    lost: bool = False  # every call on it fails with GPU_IS_LOST until cleared
    # health (telemetry/health.py): None makes the call answer NOT_SUPPORTED
    temperature_c: int | None = 52
    clock_event_reasons: int | None = 0x4  # SW power cap, as an H200 GEMM loop runs
    ecc_errors: tuple[int, int] | None = (3, 0)  # (corrected, uncorrected)
    events: bool = True  # whether the GPU registers for Xid events
    pending_xids: list[int] = field(default_factory=list)  # Xid codes an event set will hand out
    # The SM clock as a step function of the twin's time, (time, MHz) in time order; empty: clock_mhz
    clock_trace: list[tuple[float, int]] = field(default_factory=list)
    clock_events: bool = False  # whether the GPU offers clock-change events (nvmlEventTypeClock)
    delivers_clock_events: bool = True  # False: it registers them but never sends one
    # each event is sent this long after its change (negative: before it, and a read it wakes sees the old clock)
    clock_event_delay_seconds: float = 0.0


class TwinHandle(ctypes.c_void_p):
    """A device handle or event set: a pointer (its value names it to the C side) that also
    carries the twin's Python objects (``gpu``, ``mig``, ``gpus``)."""


# The C signatures (nvml.h) of the functions the C side offers: argument types after the handle,
# the out-param's type, and the arguments after the out-param.
U, U64 = ctypes.c_uint, ctypes.c_ulonglong
PROCESSES = "nvmlDeviceGetComputeRunningProcesses_v3"
C_SIDE: dict[str, tuple[tuple[type, ...], type, tuple[type, ...]]] = {
    "nvmlDeviceGetClockInfo": ((U,), U, ()),
    "nvmlDeviceGetPowerUsage": ((), U, ()),
    "nvmlDeviceGetTemperature": ((U,), U, ()),
    "nvmlDeviceGetCurrentClocksEventReasons": ((), U64, ()),
    "nvmlDeviceGetTotalEccErrors": ((U, U), U64, ()),
    "nvmlDeviceGetMemoryInfo": ((), pynvml.c_nvmlMemory_t, ()),
    "nvmlEventSetWait_v2": ((), pynvml.c_nvmlEventData_t, (U,)),
    # (handle, unsigned *count, nvmlProcessInfo_v3_t *infos): the count is in and out (Twin._c_processes)
    PROCESSES: ((), U, (ctypes.POINTER(pynvml.c_nvmlProcessInfo_v3_t),)),
}


class Twin:
    """Behaves like the pynvml module for the calls NvmlSource makes."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = MetricsRequest
    c_nvmlMemory_t = pynvml.c_nvmlMemory_t
    c_nvmlEventData_t = pynvml.c_nvmlEventData_t
    c_nvmlProcessInfo_v3_t = pynvml.c_nvmlProcessInfo_v3_t
    NVML_ERROR_INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    NVML_SUCCESS = NVML_SUCCESS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC

    def __init__(self, gpus: list[TwinGpu], now: Any, library: bool = True, c_side: bool = True,
                 sleep: Any = None) -> None:
        self.gpus = gpus
        self.now = now  # callable: the fake monotonic clock
        self.sleep = sleep  # how an event wait passes its time (the fake clock's, or time.sleep); None: it does not
        self.library = library
        self.c_side = c_side  # whether _nvmlGetFunctionPointer offers C functions
        self.inits = 0
        self.live_samples = 0
        self.live_event_sets = 0
        self.c_calls: Counter[str] = Counter()  # calls that came through the C side
        self._pointers: dict[int, TwinHandle] = {}
        self._functions: dict[str, Any] = {}

    # -- the C side ----------------------------------------------------------------
    def _handle(self, **objects: Any) -> TwinHandle:
        handle = TwinHandle(len(self._pointers) + 1)
        handle.__dict__.update(objects)
        self._pointers[handle.value] = handle
        return handle

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        if not self.c_side or name not in C_SIDE:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if name not in self._functions:
            self._functions[name] = self._c_function(name)
        return self._functions[name]

    def _c_function(self, name: str) -> Any:
        before, out_type, after = C_SIDE[name]
        if name == PROCESSES:
            return ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(out_type), *after)(self._c_processes)
        python = getattr(self, name)
        prototype = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *before, ctypes.POINTER(out_type), *after)
        n = len(before)

        def c_function(pointer: int, *rest: Any) -> int:
            self.c_calls[name] += 1
            try:
                value = python(self._pointers[pointer], *rest[:n], *rest[n + 1:])
            except NVMLError as exc:
                return exc.value
            out = rest[n].contents
            if isinstance(out, ctypes.Structure):
                for field_name, field_type in out._fields_:
                    if hasattr(value, field_name):
                        item = getattr(value, field_name)
                        # a handle (an event's device) goes into the structure's pointer field
                        setattr(out, field_name, ctypes.cast(item, field_type) if isinstance(item, ctypes.c_void_p)
                                else item)
            else:
                out.value = value
            return NVML_SUCCESS

        return prototype(c_function)

    def _c_processes(self, pointer: int, count: Any, infos: Any) -> int:
        """NVML's process list: too small a count (pynvml's first call passes 0 and no array)
        answers INSUFFICIENT_SIZE with the count needed."""
        self.c_calls[PROCESSES] += 1
        try:
            running = self.nvmlDeviceGetComputeRunningProcesses(self._pointers[pointer])
        except NVMLError as exc:
            return exc.value
        room, count.contents.value = count.contents.value, len(running)
        if len(running) > room or (running and not infos):
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, process in enumerate(running):
            infos[i].pid, infos[i].usedGpuMemory = process.pid, process.usedGpuMemory
        return NVML_SUCCESS

    # -- helpers -----------------------------------------------------------------
    def _gpu(self, handle: Any) -> TwinGpu:
        gpu = handle.gpu
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    # -- library -----------------------------------------------------------------
    def nvmlInit(self) -> None:
        if not self.library:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "twin"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._handle(gpu=self.gpus[index], mig=None)

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(pciDeviceId=(self._gpu(h).pci_device_id << 16) | 0x10DE)

    def nvmlDeviceGetMaxClockInfo(self, h: Any, kind: int) -> int:
        return self._gpu(h).max_clock_mhz

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        gpu = self._gpu(h)
        i = bisect.bisect_right(gpu.clock_trace, self.now(), key=_time)
        return gpu.clock_trace[i - 1][1] if i else gpu.clock_mhz

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        gpu = self._gpu(h)
        return gpu.uuid if h.mig is None else f"MIG-{gpu.uuid}-{h.mig}"

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._gpu(h).name

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        return SimpleNamespace(isSupportedDevice=int(self._gpu(h).gpm))

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        gpu = self._gpu(h)
        return [1, 1] if gpu.mig_instances else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, i: int) -> Any:
        gpu = self._gpu(h)
        if i >= len(gpu.mig_instances):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._handle(gpu=gpu, mig=gpu.mig_instances[i])

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return h.mig

    # -- GPM -----------------------------------------------------------------------
    def nvmlGpmSampleAlloc(self) -> Any:
        self.live_samples += 1
        return SimpleNamespace(gpu=None)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.live_samples -= 1

    def nvmlGpmSampleGet(self, h: Any, sample: Any) -> Any:
        gpu = self._gpu(h)
        if not gpu.gpm:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample.gpu = gpu
        return sample

    def nvmlGpmMigSampleGet(self, h: Any, instance: int, sample: Any) -> Any:
        sample.instance = instance
        return self.nvmlGpmSampleGet(h, sample)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        gpu: TwinGpu = request.sample2.gpu
        if {m.metricId for m in request.metrics[: request.numMetrics]} & gpu.refuse_calls_with:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT, as an older driver might answer
        for metric in request.metrics[: request.numMetrics]:
            if metric.metricId in gpu.refused_metrics:
                metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn, metric.value = NVML_SUCCESS, gpu.gpm_values.get(metric.metricId, 0.0)
        return request

    # -- power, memory, processes --------------------------------------------------
    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return int(self._gpu(h).power_watts * 1000)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        gpu = self._gpu(h)
        if not gpu.memory_follows_processes:
            return SimpleNamespace(used=1 << 30, total=141 << 30)
        known = sum(b for _, b in gpu.processes if b != NOT_AVAILABLE)
        return SimpleNamespace(used=DRIVER_RESERVED_BYTES + known, total=141 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self._gpu(h).processes]

    def nvmlDeviceGetProcessUtilization(self, h: Any, since: int) -> list[Any]:
        gpu = self._gpu(h)
        if not gpu.process_sm_percent:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=p, smUtil=u) for p, u in gpu.process_sm_percent.items()]


    # -- health --------------------------------------------------------------------
    def _supported(self, value: Any) -> Any:
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._supported(self._gpu(h).temperature_c)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._supported(self._gpu(h).clock_event_reasons)

    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: int, counter: int) -> int:
        return self._supported(self._gpu(h).ecc_errors)[kind]

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        gpu = self._gpu(h)
        return (XID_EVENT | 0x1 | 0x2 if gpu.events else 0) | (CLOCK_EVENT if gpu.clock_events else 0)

    def nvmlEventSetCreate(self) -> Any:
        self.live_event_sets += 1
        return self._handle(gpus=[], clocks={})  # clocks: handle value -> [handle, time of the last change sent]

    def nvmlEventSetFree(self, events: Any) -> None:
        self.live_event_sets -= 1

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, events: Any) -> None:
        gpu = self._gpu(h)
        if types & CLOCK_EVENT:
            if not gpu.clock_events:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            events.clocks[h.value] = [h, self.now()]  # changes from now on are sent
        if types & XID_EVENT:
            if not gpu.events:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            events.gpus.append(gpu)

    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int) -> Any:
        for gpu in events.gpus:
            if gpu.pending_xids:
                return SimpleNamespace(eventType=XID_EVENT, eventData=gpu.pending_xids.pop(0))
        # the first clock change not yet sent, of any GPU in the set: sent at once if it is past,
        # else when it comes, if within the timeout
        now = self.now()
        changes = []
        for entry in events.clocks.values():
            gpu = entry[0].gpu
            i = bisect.bisect_right(gpu.clock_trace, entry[1], key=_time)
            if gpu.delivers_clock_events and i < len(gpu.clock_trace):
                changes.append((gpu.clock_trace[i][0] + gpu.clock_event_delay_seconds, entry, gpu.clock_trace[i][0]))
        if changes:
            when, entry, change = min(changes, key=_time)
            if when <= now + timeout_ms / 1000:
                if when > now and self.sleep is not None:
                    self.sleep(when - now)
                entry[1] = change
                return SimpleNamespace(eventType=CLOCK_EVENT, eventData=0, device=entry[0])
        if self.sleep is not None and timeout_ms:
            self.sleep(timeout_ms / 1000)
        raise NVMLError(NVML_ERROR_TIMEOUT)
