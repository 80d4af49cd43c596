"""The whole captured step as one CUDA graph on a device profile, timed (runs on a GPU).

A cost table times each launch alone (``profile/timing.py``). On steps of kernels that run a few
µs, that overstates what the same kernels take back to back in one graph: in the H200 run of
2026-12-01 the single-device graphs ran 2–46 % below their columns' sums
(docs/validation/place-h200-pairs.md). So ``kernelfleet profile`` also times the step whole on
each device, and :meth:`CostTable.calibrated` scales that device's column to it.

The graph is the one the executor builds for a plan that puts every launch on this device: a copy
of each launch of the program (``raw.program_nodes``: kernels, copies, memsets) in capture order,
each after the one before, added in the device's context (a green context's, to run on its
partition). It holds ``copies`` such chains back to back, as ``bench disagg``'s single-device rows
run two slots in one graph, and the time is per copy: the median of ``trials`` launches between CUDA
events, after one launch that warms it. Replaying the step mutates its buffers, as the per-launch
timing does; the captured step is replayed afterwards, which recomputes every activation.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.raw import program_nodes
from kernelfleet.profile.timing import median_seconds

COPIES = 2  # bench disagg's default slots: the measurement its single-device rows make


def graph_seconds(captured: Captured, stream: torch.cuda.Stream, context: Any = None, *, trials: int = 10,
                  copies: int = COPIES) -> float:
    """Median seconds of one copy of the whole step as a graph on ``stream``, its nodes added in
    ``context`` (a partition's: :attr:`DeviceProfile.context`; None: the capture's, the whole GPU)."""
    driver, where = captured.driver, captured.context if context is None else context
    nodes = program_nodes(captured.raw)
    with driver.in_context(where):
        graph = driver.create_graph()
        try:
            previous: list[Any] = []
            for _ in range(copies):
                for node in nodes:
                    previous = [driver.add_copy_of(graph, captured.nodes[node], previous, where)]
            executable = driver.instantiate(graph)
        except Exception:
            driver.destroy(graph)
            raise
    try:
        def launch() -> None:
            driver.launch(executable, stream.cuda_stream)

        launch()  # warm: module load, caches
        seconds = median_seconds(launch, stream, trials) / copies
    finally:
        driver.destroy(graph, executable)
    captured.replay()
    torch.cuda.synchronize()
    return seconds
