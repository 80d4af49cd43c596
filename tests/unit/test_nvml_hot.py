"""The sampler's hot reads on NVML's C functions (telemetry/nvml_hot.py), against pynvml's wrapper
path on the NVML twin; slow health fields read every few seconds; the poll loop's deadlines."""

import ctypes
import dataclasses

import pytest
from nvml_twin import C_SIDE, Twin, TwinGpu

from kernelfleet.errors import Unsupported
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml, NvmlCallFailed
from kernelfleet.telemetry.nvml_hot import bind, clock_reader

pytestmark = pytest.mark.unit


def gpus():
    return [TwinGpu(processes=[(4242, 1 << 30)], pending_xids=[79], clock_event_reasons=0x24),
            TwinGpu(uuid="GPU-twin-1", mig_instances=[1, 2], ecc_errors=(5, 2), temperature_c=None)]


def on_twin(twin_gpus, fake_time, c_side=True, sleep=None, **kw):
    """A source on a twin of ``twin_gpus`` with 1-s windows and 100-ms clock polls on fake time."""
    twin = Twin(twin_gpus, fake_time.now, c_side=c_side)
    return twin, NvmlSource(interval_seconds=1.0, nvml=Nvml(twin), clock=fake_time.now, wall=fake_time.wall,
                            sleep=sleep or fake_time.sleep, **{"clock_poll_seconds": 0.1, **kw})


def run(fake_time, windows=4, c_side=True, **kw):
    twin, source = on_twin(gpus(), fake_time, c_side, **kw)
    with source:
        clocks = iter([1400, 1455, 1980, 1700, 1500] * 20)
        batches = []
        for batch in source.batches(count=windows):
            batches.append([dataclasses.asdict(s) for s in batch])
            for gpu in twin.gpus:
                gpu.clock_mhz = next(clocks)
    return twin, batches


def test_c_functions_give_the_same_samples_as_pynvml_wrappers(fake_time):
    start = fake_time.now()
    hot_twin, hot = run(fake_time)
    fake_time.t = start
    old_twin, old = run(fake_time, hot_reads=False)
    assert hot == old
    (whole, *_), _ = hot[0], None
    assert (whole["temperature_celsius"], whole["clock_event_reasons_bitmask"], whole["xid_last"]) == (52.0, 0x24, 79)
    assert whole["memory_total_bytes"] == 141 << 30 and whole["power_mean_watts"] == pytest.approx(691.0)
    # every hot read went through the C side, none of pynvml's path did
    assert set(hot_twin.c_calls) == set(C_SIDE) and not old_twin.c_calls
    assert hot_twin.c_calls["nvmlDeviceGetClockInfo"] == 2 * sum(b[0]["sm_clock_polls"] for b in hot)


def test_a_twin_without_c_functions_reads_through_the_doorway(fake_time):
    start = fake_time.now()
    twin, plain = run(fake_time, c_side=False)
    fake_time.t = start
    _, hot = run(fake_time)
    assert plain == hot and not twin.c_calls


@pytest.mark.parametrize("direct", [True, False])
def test_bound_reads_raise_what_the_doorway_raises(fake_time, direct):
    gpu = TwinGpu(temperature_c=None)
    twin = Twin([gpu], fake_time.now)
    nvml = Nvml(twin)
    handle = twin.nvmlDeviceGetHandleByIndex(0)
    clock = clock_reader(nvml, handle, direct=direct)
    assert clock() == 1446e6
    temperature = bind(nvml, "nvmlDeviceGetTemperature", (handle, 0), ctypes.c_uint, direct=direct)
    with pytest.raises(Unsupported, match="nvmlDeviceGetTemperature: not supported"):
        temperature()
    gpu.lost = True
    with pytest.raises(NvmlCallFailed, match=r"nvmlDeviceGetClockInfo failed: NVML error 15 \(NVML code 15\)"):
        clock()
    events = twin.nvmlEventSetCreate()
    wait = bind(nvml, "nvmlEventSetWait_v2", (events,), twin.c_nvmlEventData_t, (0,),
                quiet=twin.NVML_ERROR_TIMEOUT, direct=direct)
    assert wait() is None  # no event: the usual answer, not an error
    assert bool(twin.c_calls) is direct


def test_temperature_and_ecc_are_read_every_few_seconds_the_rest_every_window(fake_time):
    gpu = TwinGpu(temperature_c=50, ecc_errors=(0, 0), clock_event_reasons=0x4)
    twin, source = on_twin([gpu], fake_time, slow_health_seconds=3.0)
    seen = []
    with source:
        for i, (s,) in enumerate(source.batches(count=7)):
            seen.append((s.temperature_celsius, s.ecc_corrected_errors_total, s.clock_event_reasons_bitmask))
            gpu.temperature_c, gpu.ecc_errors, gpu.clock_event_reasons = 60 + i, (i + 1, 0), 0x4 | (i + 1) << 8
    # windows 0, 3 and 6 read the slow fields (3 s apart); the reasons change every window
    assert seen == [(50.0, 0, 0x4), (50.0, 0, 0x104), (50.0, 0, 0x204), (62.0, 3, 0x304),
                    (62.0, 3, 0x404), (62.0, 3, 0x504), (65.0, 6, 0x604)]
    assert twin.c_calls["nvmlDeviceGetTemperature"] == 3


def test_slow_fields_every_window_when_asked(fake_time):
    gpu = TwinGpu(temperature_c=50)
    _, source = on_twin([gpu], fake_time, slow_health_seconds=0)
    temperatures = []
    with source:
        for i, (s,) in enumerate(source.batches(count=3)):
            temperatures.append(s.temperature_celsius)
            gpu.temperature_c = 51 + i
    assert temperatures == [50.0, 51.0, 52.0]


def test_slow_fields_are_read_again_at_once_after_a_reinit(fake_time):
    gpu = TwinGpu(temperature_c=50)
    _, source = on_twin([gpu], fake_time, slow_health_seconds=60.0)
    with source:
        batches = source.batches(count=4)
        next(batches)
        gpu.lost = True
        (stale,) = next(batches)
        gpu.lost, gpu.temperature_c = False, 70
        next(batches)  # the window NVML came back in was never opened: stale
        (back,) = next(batches)
    assert stale.stale and not back.stale and back.temperature_celsius == 70.0


def test_process_names_are_read_once_while_the_process_stays(fake_time, tmp_path):
    (tmp_path / "4242").mkdir()
    comm = tmp_path / "4242" / "comm"
    comm.write_text("python\n")
    # (its memory comes and goes with it, which is what makes a window list the processes again)
    gpu = TwinGpu(processes=[(4242, 1 << 30)], memory_follows_processes=True)
    _, source = on_twin([gpu], fake_time, proc_root=tmp_path)
    names = []
    with source:
        for i, (s,) in enumerate(source.batches(count=4)):
            names.append([p.name for p in s.processes])
            if i == 0:
                comm.write_text("renamed\n")  # not read again while 4242 stays on the GPU
            if i == 1:
                gpu.processes = []  # it leaves; a process with its PID later is read afresh
            if i == 2:
                gpu.processes = [(4242, 1 << 30)]
    assert names == [["python"], ["python"], [], ["renamed"]]


class JitterySleep:
    """A sleep that always overruns by 3 ms, and once by a whole 350 ms (a held-up loop)."""

    def __init__(self, fake_time, stall_at: int) -> None:
        self.fake_time, self.calls, self.stall_at = fake_time, 0, stall_at

    def __call__(self, seconds: float) -> None:
        self.calls += 1
        self.fake_time.sleep(seconds + (0.35 if self.calls == self.stall_at else 0.003))


def test_polls_keep_to_absolute_deadlines_and_skip_the_ones_missed(fake_time):
    sleep = JitterySleep(fake_time, stall_at=13)
    _, source = on_twin([TwinGpu()], fake_time, sleep=sleep, adaptive_clock_poll=False)
    with source:
        start = fake_time.now()
        batches = list(source.batches(count=2))
    # overruns do not add up: the second window still ends 2.003 s after the start
    assert fake_time.now() - start == pytest.approx(2.003)
    # the 350-ms stall in the second window costs its three missed reads, no burst to make them up
    assert [b[0].sm_clock_polls for b in batches] == [10, 7]
    assert sleep.calls == 17


@pytest.fixture
def pynvml_over_twin(fake_time):
    """The real pynvml module with the twin's C functions in its function-pointer cache (what
    nvmlInit's library load would give), restored afterwards."""
    import pynvml

    twin = Twin([TwinGpu(clock_mhz=1530, power_watts=412.0)], fake_time.now)
    cache = pynvml._nvmlGetFunctionPointer_cache
    saved = dict(cache)
    cache.update({name: twin._nvmlGetFunctionPointer(name) for name in C_SIDE})
    yield pynvml, twin
    cache.clear()
    cache.update(saved)


def test_bound_reads_take_pynvml_s_own_function_pointers(pynvml_over_twin):
    pynvml, twin = pynvml_over_twin
    nvml, handle = Nvml(pynvml), twin.nvmlDeviceGetHandleByIndex(0)
    assert clock_reader(nvml, handle)() == pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) * 1e6 == 1530e6
    power = bind(nvml, "nvmlDeviceGetPowerUsage", (handle,), ctypes.c_uint)
    assert power() == pynvml.nvmlDeviceGetPowerUsage(handle) == 412000
    memory = bind(nvml, "nvmlDeviceGetMemoryInfo", (handle,), pynvml.c_nvmlMemory_t)()
    assert (memory.used, memory.total) == (1 << 30, 141 << 30)
    assert twin.c_calls["nvmlDeviceGetClockInfo"] == 2  # ours and pynvml's wrapper: the same C function
    assert nvml.function_pointer("nvmlDeviceGetNoSuchThing") is None  # NVML not loaded: no pointer, no raise


def test_statuses_become_the_doorway_errors_with_pynvml_s_text():
    import pynvml

    nvml = Nvml(pynvml)
    lost = nvml.error("nvmlDeviceGetClockInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    assert isinstance(lost, NvmlCallFailed) and lost.code == pynvml.NVML_ERROR_GPU_IS_LOST
    assert str(lost) == "nvmlDeviceGetClockInfo failed: GPU is lost (NVML code 15)"
    assert isinstance(nvml.error("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_NOT_SUPPORTED), Unsupported)


def test_the_process_list_is_one_c_call_with_pynvml_s_answer(pynvml_over_twin):
    from kernelfleet.telemetry.processes import PROCESS_SLOTS, PROCESSES_CALL, process_lister

    pynvml, twin = pynvml_over_twin
    gpu = twin.gpus[0]
    nvml, handle = Nvml(pynvml), twin.nvmlDeviceGetHandleByIndex(0)
    lister = process_lister(nvml, handle)
    assert lister() == [] and twin.c_calls[PROCESSES_CALL] == 1
    gpu.processes = [(4242, 1 << 30), (4243, 2**64 - 1)]  # NVML_VALUE_NOT_AVAILABLE: memory unknown
    ours, theirs = lister(), pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in ours] == [(p.pid, p.usedGpuMemory) for p in theirs] == [
        (4242, 1 << 30), (4243, None)]
    assert twin.c_calls[PROCESSES_CALL] == 2 + 2  # one call for ours; pynvml's asks for the count first
    # more processes than the bound array holds: pynvml's sized call lists every one
    gpu.processes = [(pid, 1 << 20) for pid in range(1, PROCESS_SLOTS + 10)]
    assert [p.pid for p in lister()] == list(range(1, PROCESS_SLOTS + 10))
    gpu.lost = True
    with pytest.raises(NvmlCallFailed, match="GPU is lost"):
        lister()


def test_gpm_requests_keep_pynvml_s_layout_without_its_field_hooks(fake_time):
    import pynvml

    from kernelfleet.telemetry.gpm import GPM_METRICS, GpmMetrics
    from kernelfleet.telemetry.nvml_hot import plain_layout

    plain = plain_layout(pynvml.c_nvmlGpmMetricsGet_t)
    assert ctypes.sizeof(plain) == ctypes.sizeof(pynvml.c_nvmlGpmMetricsGet_t)
    for (name, _), (same, _) in zip(plain._fields_, pynvml.c_nvmlGpmMetricsGet_t._fields_, strict=True):
        assert name == same and getattr(plain, name).offset == getattr(pynvml.c_nvmlGpmMetricsGet_t, name).offset
    element = plain._fields_[-1][1]._type_
    assert element.value.offset == pynvml.c_nvmlGpmMetric_t.value.offset and element.__getattribute__ is \
        ctypes.Structure.__getattribute__  # no per-field Python hook
    assert plain_layout(Twin.c_nvmlGpmMetricsGet_t) is Twin.c_nvmlGpmMetricsGet_t  # the twin's own request

    # "NVML" answers through pynvml's own wrapper, writing pynvml's layout at the pointer it is given
    def metrics_get(address):
        request = pynvml.c_nvmlGpmMetricsGet_t.from_address(address)
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION and request.numMetrics == len(GPM_METRICS)
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.nvmlReturn, metric.value = (3, 0.0) if metric.metricId == 10 else (0, metric.metricId * 2.0)
        return 0

    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(metrics_get)
    cache = pynvml._nvmlGetFunctionPointer_cache
    saved = dict(cache)
    cache["nvmlGpmMetricsGet"] = callback
    try:
        values = GpmMetrics(Nvml(pynvml), lambda *_: None, cycle_counters=False).metrics(
            pynvml.c_nvmlGpmSample_t(), pynvml.c_nvmlGpmSample_t())
    finally:
        cache.clear()
        cache.update(saved)
    assert values["tensor_active_ratio"] == pytest.approx(5 * 2.0 * 0.01) and values["dram_bandwidth_ratio"] is None
    assert values["nvlink_rx_bytes_per_second"] == pytest.approx(60 * 2.0 * 1024 * 1024)
