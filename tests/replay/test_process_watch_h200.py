"""The process list kept between changes of the used memory (telemetry/process_watch.py), on what two
H200s and one reported: a data-parallel job starting, growing and exiting
(tests/data/h200x2-detector), a GEMM loop starting (tests/data/h200). Every window listed only when
the rule says so carries exactly the processes and memory recorded in it."""

from pathlib import Path

import pytest
from nvml_twin import Twin

from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.process_watch import ProcessWatch
from kernelfleet.telemetry.processes import Listed
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.replay
DATA = Path(__file__).parents[1] / "data"


def carried(path, tmp_path):
    """Per GPU: each window's (pid, memory) as recorded and as the watch gives them; the lists made."""
    by_gpu: dict[int, list] = {}
    for batch in ReplaySource(path).batches():
        for s in batch:
            by_gpu.setdefault(s.gpu_index, []).append(s)
    out = {}
    for gpu, samples in by_gpu.items():
        now = [None]

        def lister(now=now):
            return [Listed(p.pid, p.used_memory_bytes) for p in now[0].processes]

        watch = ProcessWatch(Nvml(Twin([], lambda: 0.0)), None, lister, tmp_path)
        recorded, given = [], []
        for s in samples:
            now[0] = s
            recorded.append([(p.pid, p.used_memory_bytes) for p in s.processes])
            processes = watch.read(s.memory_used_bytes, s.timestamp_seconds, 0)
            given.append([(p.pid, p.used_memory_bytes) for p in processes])
        out[gpu] = recorded, given, watch.lists_total
    return out


def test_a_data_parallel_job_is_attributed_in_every_window_with_a_fifth_of_the_lists(tmp_path):
    runs = carried(DATA / "h200x2-detector" / "h200x2-ddp.jsonl.gz", tmp_path)
    assert all(given == recorded and len(recorded) == 105 for recorded, given, _ in runs.values())
    # CUDA's start (memory first, the process 4 s later), the job's two allocations, a shrink and the
    # exit are each a change of the used memory, listed in its window and the next (GPU 1's start
    # took two windows); 10 s after the last list, once more
    assert {gpu: lists for gpu, (_, _, lists) in runs.items()} == {0: 19, 1: 20}


def test_a_gemm_loop_is_attributed_from_its_first_window(tmp_path):
    ((recorded, given, lists),) = carried(DATA / "h200" / "h200-bf16-gemm.jsonl.gz", tmp_path).values()
    assert given == recorded and recorded[1] == [(453, 1050673152)] and len(recorded) == 24
    assert lists == 4  # the first window, the process's first (its memory showed) and the next, one 10 s later

