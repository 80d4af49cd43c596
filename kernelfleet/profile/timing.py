"""Per-kernel timing on a device profile: each captured launch replayed alone (runs on a GPU).

A launch is timed as a graph of ``count`` back-to-back copies of its node, between CUDA events,
divided by ``count`` — so a 3-µs kernel is not buried under the launch cost of a graph per
kernel, and it runs as it will in the executor's graph segments. ``count`` is chosen per launch
so that a trial lasts at least ``trial_seconds``; the median of ``trials`` trials is kept.
Replaying copies mutates buffers (an in-place kernel applied ``count`` times): the captured step
is replayed afterwards, which recomputes every activation from the unchanged weights and inputs.

A kernel whose op call resets its state with a memset first (stream-K GEMMs, cuDNN attention:
``replay.preludes``) is replayed as memsets-then-kernel, as the graph runs it, and the memsets'
own median time is taken off; replayed alone it would skip its work (before this, 8B prefill's
attention and split GEMMs timed at 2,600–22,000 TFLOP/s on the H200, DiT's at up to 280,000).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.raw import program_nodes

MAX_COPIES = 200


def time_launches(captured: Captured, stream: torch.cuda.Stream, *, resets: Mapping[int, list[int]], context: Any = None,
                  trials: int = 5, trial_seconds: float = 200e-6, flush_l2_bytes: int = 0, copies: int | None = None,
                  progress: Callable[[int], None] | None = None) -> list[float]:
    """Median seconds of every launch of the program on ``stream``, its graphs built in ``context``
    (a partition's: :attr:`DeviceProfile.context`; None: the capture's, the whole GPU).
    ``resets``: ``replay.replay_preludes`` of the captured program: the memsets and fills each kernel runs after.

    ``flush_l2_bytes`` > 0 writes a buffer that large before every trial and times one copy of the
    launch (a cold L2, as when the kernel before it on its device touched other data; the H200's L2
    is 60 MB, so 256 MB clears it); 0 times back-to-back copies (a warm L2).

    ``copies`` fixes the number of back-to-back copies per trial (None: enough for ``trial_seconds``;
    always 1 with a flush). One copy without a flush is the cold run's control: it pays the same
    graph-launch cost per trial with a warm L2, so cold minus it is the L2's share alone."""
    runner = captured.replayer(context)  # through the driver that read the capture
    flush = torch.empty(flush_l2_bytes, dtype=torch.uint8, device=stream.device) if flush_l2_bytes else None
    nodes = program_nodes(captured.raw)

    def trial(node: int, count: int, prelude: tuple[int, ...]) -> float:
        if flush is not None:
            with torch.cuda.stream(stream):
                flush.zero_()
        return _seconds(stream, lambda: runner.repeated(node, count, stream.cuda_stream, prelude)) / count

    seconds: list[float] = []
    try:
        for launch, node in enumerate(nodes):
            prelude = tuple(nodes[m] for m in resets.get(launch, ()))
            trial(node, 1, prelude)  # warm: module load, caches
            first = trial(node, 1, prelude)
            if flush is not None:
                count = 1
            elif copies is not None:
                count = copies
            else:
                count = max(1, min(MAX_COPIES, math.ceil(trial_seconds / max(first, 1e-7))))
            measured = statistics.median(trial(node, count, prelude) for _ in range(trials))
            seconds.append(max(0.0, measured - sum(seconds[m] for m in resets.get(launch, ()))))
            if progress:
                progress(1)
    finally:
        runner.close()
    captured.replay()
    torch.cuda.synchronize()
    return seconds


def calibrate(stream: torch.cuda.Stream, device: int = 0, *, repeats: int = 10) -> dict[str, float]:
    """bf16 8192³ GEMM FLOP/s, bf16 8192×8192 GEMV bytes/s and 1 GiB copy bytes/s on ``stream``.

    GEMM FLOPs 2·n³; GEMV bytes: the matrix read once (n²·2 B) — the vector and result are
    negligible; copy bytes: read plus write (2 × 1 GiB).
    """
    n, cuda = 8192, f"cuda:{device}"
    a = torch.randn(n, n, dtype=torch.bfloat16, device=cuda)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=cuda)
    x = torch.randn(n, 1, dtype=torch.bfloat16, device=cuda)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=cuda)
    dst = torch.empty_like(src)
    work = {"gemm_flops_per_second": (lambda: a @ b, 2 * n ** 3),
            "gemv_bytes_per_second": (lambda: a @ x, 2 * n * n),
            "copy_bytes_per_second": (lambda: dst.copy_(src), 2 * src.numel())}
    out = {}
    with torch.cuda.stream(stream):
        for key, (run, amount) in work.items():
            for _ in range(3):
                run()
            out[key] = amount * repeats / _seconds(stream, run, repeats)
    return out


def _seconds(stream: torch.cuda.Stream, run: Callable[[], object], repeats: int = 1) -> float:
    """GPU seconds of ``repeats`` calls of ``run`` on ``stream``, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(repeats):
        run()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def median_seconds(run: Callable[[], object], stream: torch.cuda.Stream, trials: int = 10) -> float:
    """Median GPU seconds of one call of ``run``, which launches on ``stream``, over ``trials``."""
    return statistics.median(_seconds(stream, run) for _ in range(trials))
