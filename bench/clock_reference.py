"""A dense reference for the sampler's window-mean SM clock: a child process reads every GPU's
clock every 2 ms while the sampler runs, and each sampled window's mean is compared with the
reference's step mean over the same wall-clock span.

A process of its own, so its reads and wake-ups are not in the CPU the benchmark measures (that
is the sampler's process alone); it writes only the reads that differ from the one before (the
step function loses nothing) and a last read of each GPU when it is told to stop (SIGTERM).

    python -m bench.clock_reference OUT.json [--period 0.002]
"""

from __future__ import annotations

import bisect
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench import Parser
from kernelfleet.errors import KernelfleetError
from kernelfleet.telemetry.clock import step_mean
from kernelfleet.telemetry.sample import Sample

ROOT = Path(__file__).resolve().parents[1]
PERIOD_SECONDS = 0.002  # the density of bench/clock_density.py's recordings


def read_densely(out: Path, period: float) -> None:
    """Read every GPU's SM clock every ``period`` s until SIGTERM; write the changes to ``out``."""
    from kernelfleet.telemetry.nvml_api import Nvml

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    nvml = Nvml()
    nvml.init()
    handles = [nvml.call("nvmlDeviceGetHandleByIndex", i) for i in range(nvml.call("nvmlDeviceGetCount"))]
    sm = nvml.m.NVML_CLOCK_SM
    changes: list[list[tuple[float, int]]] = [[] for _ in handles]
    reads = 0
    ready = out.with_suffix(".ready")
    ready.write_text("")  # the parent waits for this: NVML is up and reading
    while not stop:
        now = time.time()
        for gpu, handle in enumerate(handles):
            mhz = nvml.call("nvmlDeviceGetClockInfo", handle, sm)
            if not changes[gpu] or changes[gpu][-1][1] != mhz:
                changes[gpu].append((now, mhz))
        reads += 1
        time.sleep(max(0.0, period - (time.time() - now)))
    end = time.time()
    for gpu, handle in enumerate(handles):
        changes[gpu].append((end, nvml.call("nvmlDeviceGetClockInfo", handle, sm)))
    nvml.shutdown()
    out.write_text(json.dumps({"period_seconds": period, "reads": reads, "changes": changes}))


@contextmanager
def dense_reference(out: Path, period: float = PERIOD_SECONDS) -> Iterator[list[list[tuple[float, int]]]]:
    """Run the reader for the duration of the block; the yielded list is filled with each GPU's
    ``(wall time, MHz)`` changes when the block ends."""
    ready = out.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    child = subprocess.Popen([sys.executable, "-m", "bench.clock_reference", str(out), "--period", str(period)],
                             cwd=ROOT)
    deadline = time.monotonic() + 30
    while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    result: list[list[tuple[float, int]]] = []
    try:
        yield result
    finally:
        child.terminate()
        child.wait(timeout=30)
        if out.exists():
            result.extend([[(t, m) for t, m in gpu] for gpu in json.loads(out.read_text())["changes"]])


def window_errors(windows: Iterable[Sample], reference: Sequence[Sequence[tuple[float, int]]]) -> list[float]:
    """|sampled mean - reference mean| / reference mean of every whole-GPU window the reference covers."""
    errors = []
    for s in windows:
        if s.mig_instance is not None or s.sm_clock_mean_hertz is None or s.gpu_index >= len(reference):
            continue
        steps = reference[s.gpu_index]
        start, end = s.timestamp_seconds - s.window_seconds, s.timestamp_seconds
        times = [t for t, _ in steps]
        if not steps or times[0] > start or times[-1] < end:
            continue  # the reference was not reading all through this window
        lo, hi = bisect.bisect_right(times, start), bisect.bisect_right(times, end)
        truth = step_mean([(t, m * 1e6) for t, m in steps[lo:hi]], start, end, steps[lo - 1][1] * 1e6).mean
        errors.append(abs(s.sm_clock_mean_hertz - truth) / truth)  # type: ignore[operator]
    return errors


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--period", type=float, default=PERIOD_SECONDS)
    args = parser.parse_args()
    read_densely(args.out, args.period)


if __name__ == "__main__":
    try:
        main()
    except KernelfleetError as exc:  # no NVML here: one line, and the benchmark goes on without a reference
        sys.exit(f"clock_reference: {exc}")
