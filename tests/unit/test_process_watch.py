"""The process list read only when something says it changed (telemetry/process_watch.py), on the NVML
twin whose used memory follows its processes as a GPU's does: a process that starts or exits is
attributed in the window its memory shows, a shared GPU is listed every window, a still one within
the age bound."""

import pytest
from nvml_twin import PROCESSES, Twin, TwinGpu

from kernelfleet.errors import UsageError
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml

pytestmark = pytest.mark.unit
GIB = 1 << 30


def on_twin(gpus, fake_time, **kw):
    twin = Twin(gpus, fake_time.now)
    return twin, NvmlSource(interval_seconds=1.0, nvml=Nvml(twin), clock=fake_time.now, wall=fake_time.wall,
                            sleep=fake_time.sleep, **kw)


def windows(source, gpu, twin, changes):
    """One window per item of ``changes`` (the processes set before it ends, or None: unchanged);
    each window's (pids, process lists made in it)."""
    seen = []
    with source:
        batches = source.batches()
        for change in changes:
            if change is not None:
                gpu.processes = change
            lists = twin.c_calls[PROCESSES]
            (s, *_) = next(batches)
            seen.append(([p.pid for p in s.processes], twin.c_calls[PROCESSES] - lists))
    return seen


def test_a_process_that_starts_or_exits_is_attributed_in_the_window_its_memory_shows(fake_time):
    gpu = TwinGpu(memory_follows_processes=True)
    twin, source = on_twin([gpu], fake_time)
    job = [(4242, 3 * GIB)]
    seen = windows(source, gpu, twin, [None, None, None, job, None, None, None, [], None, None])
    assert [pids for pids, _ in seen] == [[], [], [], [4242], [4242], [4242], [4242], [], [], []]
    # listed in the first window and the one after it, at the change and the one after it; not while still
    assert [n for _, n in seen] == [1, 1, 0, 1, 1, 0, 0, 1, 1, 0]


def test_a_process_that_allocates_is_listed_again_with_its_new_memory(fake_time):
    gpu = TwinGpu(memory_follows_processes=True, processes=[(7, GIB)])
    _, source = on_twin([gpu], fake_time)
    with source:
        batches = source.batches()
        for _ in range(3):
            next(batches)
        gpu.processes = [(7, 5 * GIB)]
        (grown,) = next(batches)
    assert [(p.pid, p.used_memory_bytes) for p in grown.processes] == [(7, 5 * GIB)]


def test_a_shared_gpu_is_listed_every_window_with_its_sm_shares(fake_time):
    gpu = TwinGpu(memory_follows_processes=True, processes=[(10, GIB), (11, 2 * GIB)],
                  process_sm_percent={10: 60, 11: 25})
    twin, source = on_twin([gpu], fake_time)
    shares = []
    with source:
        for i, (s,) in enumerate(source.batches(count=5)):
            shares.append([p.sm_active_ratio for p in s.processes])
            gpu.process_sm_percent = {10: 30 + i, 11: 40}
    assert twin.c_calls[PROCESSES] == 5  # the memory never moved
    assert shares == [[0.60, 0.25], [0.30, 0.40], [0.31, 0.40], [0.32, 0.40], [0.33, 0.40]]


def test_a_still_gpu_is_listed_again_within_the_age_bound(fake_time):
    # memory that cannot see the change (the twin's fixed 1 GiB): a swap of PIDs shows within the bound
    gpu = TwinGpu(processes=[(1, GIB)])
    twin, source = on_twin([gpu], fake_time, process_list_max_age_seconds=3.0)
    seen = windows(source, gpu, twin, [None, None, [(2, GIB)], None, None, None])
    assert [pids for pids, _ in seen] == [[1], [1], [1], [1], [2], [2]]
    assert [n for _, n in seen] == [1, 1, 0, 0, 1, 0]


def test_age_zero_lists_every_window_as_before(fake_time):
    gpu = TwinGpu(memory_follows_processes=True, processes=[(1, GIB)])
    twin, source = on_twin([gpu], fake_time, process_list_max_age_seconds=0.0)
    seen = windows(source, gpu, twin, [None] * 4)
    assert [n for _, n in seen] == [1, 1, 1, 1]
    (target,) = source._targets
    assert target.processes.lists_total == 4


def test_a_gpu_without_memory_info_is_listed_every_window(fake_time):
    gpu = TwinGpu(processes=[(1, GIB)])
    twin = Twin([gpu], fake_time.now)

    def no_memory(_handle):
        raise twin.NVMLError(twin.NVML_ERROR_NOT_SUPPORTED)

    twin.nvmlDeviceGetMemoryInfo = no_memory
    source = NvmlSource(interval_seconds=1.0, nvml=Nvml(twin), clock=fake_time.now, wall=fake_time.wall,
                        sleep=fake_time.sleep, hot_reads=False)
    with source:
        batches = list(source.batches(count=4))
    assert all(b[0].memory_used_bytes is None and [p.pid for p in b[0].processes] == [1] for b in batches)
    assert source._targets[0].processes.lists_total == 4


def test_mig_slices_list_on_their_own_memory(fake_time):
    gpu = TwinGpu(memory_follows_processes=True, mig_instances=[1])
    _, source = on_twin([gpu], fake_time)
    with source:
        batches = source.batches()
        for _ in range(3):
            next(batches)
        gpu.processes = [(99, GIB)]  # the twin lists a GPU's processes on every handle of it
        whole, mig = next(batches)
    assert [p.pid for p in whole.processes] == [99] and [p.pid for p in mig.processes] == [99]


def test_a_negative_age_is_a_one_line_error():
    with pytest.raises(UsageError, match="process_list_max_age_seconds must be >= 0, got -1"):
        NvmlSource(process_list_max_age_seconds=-1)
