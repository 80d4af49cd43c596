"""The whole captured step as one CUDA graph on a device profile, timed three ways (runs on a GPU).

A cost table times each launch alone (``profile/timing.py``). On steps of kernels that run a few
µs, that overstates what the same kernels take back to back in one graph: in the H200 run of
2026-12-01 the single-device graphs ran 2–46 % below their columns' sums
(docs/validation/place-h200-pairs.md). So ``kernelfleet profile`` also times the step whole on
each device, and :meth:`CostTable.calibrated` scales that device's column to it.

The graph is the one the executor builds for a plan that puts every launch on this device: a copy
of each launch of the program (``raw.program_nodes``: kernels, copies, memsets) in capture order,
each after the one before, added in the device's context (a green context's, to run on its
partition). It holds ``copies`` such chains, as ``bench disagg``'s single-device rows run two
slots in one graph, each chain from a capture of its own where the caller gives one (a replica:
its own weights and activations, as each slot of ``bench disagg`` has), and every time is per copy:
the median of ``trials`` launches between CUDA events, after one launch that warms it.

* **alone** (:func:`graph_seconds`): the chains back to back, nothing else on the GPU;
* **free** (``free=True``): the chains independent ("slots free"), so the GPU may run kernels of
  both at once on the one partition;
* **shared** (:func:`shared_seconds`): the chained graph while every other device loops its own
  graph on its own stream. Looping the others, rather than launching every device's graph once
  and timing each, keeps each timed launch under load from its first kernel to its last, as the
  devices of request distribution are in steady state; launched once, the faster graph would run
  partly alone. The others are queued with enough launches to outlast the timed ones three times
  over, and a measurement whose load ran out first is taken again with twice as many.
* **together** (:func:`together_seconds`): two devices' first chains in one graph, each in its
  own context, launched together: request distribution's own graph, one copy a device. On the H100
  it ran 1.09-1.12x the slower device alone where **shared** said 1.19-1.25
  (docs/validation/place-h200-pairs.md): ``CostTable.contention_factors`` scales the shared
  factors to it.

Replaying the step mutates its buffers, as the per-launch timing does; every capture is replayed
afterwards, which recomputes every activation.
"""

from __future__ import annotations

import math
import statistics
from contextlib import ExitStack
from typing import Any, Self

import torch

from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.raw import program_nodes
from kernelfleet.profile.timing import median_seconds

COPIES = 2  # bench disagg's default slots: the measurement its single-device rows make
LOAD_MARGIN = 3.0  # the others' queued graphs outlast the timed launches this many times over
LOAD_TRIES = 3


class StepGraph:
    """The step's chains (one per capture of ``chains``) as one instantiated graph whose nodes run
    in ``context`` (None: the first capture's, the whole GPU), or chain k's in ``contexts[k]`` (None:
    its capture's); chained, or independent when ``free``."""

    def __init__(self, chains: list[Captured], context: Any = None, *, free: bool = False,
                 contexts: list[Any] | None = None) -> None:
        self.chains, self.driver = chains, chains[0].driver
        self.where = chains[0].context if context is None else context
        self.contexts = [self.where] * len(chains) if contexts is None else [
            chain.context if where is None else where for chain, where in zip(chains, contexts)]
        self.free = free
        self._graph = self._executable = None

    def __enter__(self) -> Self:
        driver = self.driver
        with driver.in_context(self.where):
            self._graph = driver.create_graph()
            try:
                previous: list[Any] = []
                for captured, where in zip(self.chains, self.contexts):
                    if self.free:
                        previous = []
                    with driver.in_context(where):
                        for node in program_nodes(captured.raw):
                            previous = [driver.add_copy_of(self._graph, captured.nodes[node], previous, where)]
                self._executable = driver.instantiate(self._graph)
            except Exception:
                driver.destroy(self._graph)
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.driver.destroy(self._graph, self._executable)
        for captured in {id(c): c for c in self.chains}.values():
            captured.replay()
        torch.cuda.synchronize()

    def launch(self, stream: torch.cuda.Stream) -> None:
        self.driver.launch(self._executable, stream.cuda_stream)


def graph_seconds(chains: list[Captured], stream: torch.cuda.Stream, context: Any = None, *, trials: int = 10,
                  free: bool = False) -> float:
    """Median seconds of one copy of the whole step as a graph of ``len(chains)`` chains on
    ``stream``, its nodes added in ``context`` (a partition's: :attr:`DeviceProfile.context`;
    None: the capture's, the whole GPU); the chains back to back, or independent when ``free``."""
    with StepGraph(chains, context, free=free) as graph:
        graph.launch(stream)  # warm: module load, caches
        return median_seconds(lambda: graph.launch(stream), stream, trials) / len(chains)


def together_seconds(devices: dict[str, tuple[list[Captured], torch.cuda.Stream, Any]], *, trials: int = 10) -> float:
    """Median seconds of one graph holding each device's first chain (``devices[name]``: its chains,
    stream and context), free of each other, each in its device's context: the devices' steps
    launched together once (module docstring), on the first device's stream."""
    if len(devices) < 2:
        raise UsageError(f"a together graph time needs at least two devices, got {', '.join(devices) or 'none'}")
    chains = [mine[0] for mine, _, _ in devices.values()]
    stream = next(iter(devices.values()))[1]
    with StepGraph(chains, free=True, contexts=[context for _, _, context in devices.values()]) as graph:
        graph.launch(stream)  # warm
        return median_seconds(lambda: graph.launch(stream), stream, trials)


def shared_seconds(devices: dict[str, tuple[list[Captured], torch.cuda.Stream, Any]], alone: dict[str, float], *,
                   trials: int = 10) -> dict[str, float]:
    """Each device's chained graph (``devices[name]``: its chains, stream and context; ``alone``
    its seconds per copy alone) timed while every other device loops its own: median seconds per
    copy (module docstring). Each device's chains should be captures of its own, or the devices
    share their buffers' L2 lines and contend less than replicas do."""
    if len(devices) < 2:
        raise UsageError(f"a shared graph time needs at least two devices, got {', '.join(devices) or 'none'}")
    with ExitStack() as stack:
        graphs = {name: stack.enter_context(StepGraph(chains, context)) for name, (chains, _, context) in
                  devices.items()}
        streams = {name: stream for name, (_, stream, _) in devices.items()}
        copies = {name: len(chains) for name, (chains, _, _) in devices.items()}
        out = {}
        for name in devices:
            for attempt in range(LOAD_TRIES):
                seconds, covered = _under_load(name, graphs, streams, alone, trials, LOAD_MARGIN * 2 ** attempt)
                if covered:
                    out[name] = seconds / copies[name]
                    break
            else:
                raise UsageError(f"device {name}: the other devices' graphs kept finishing before its timed "
                                 f"launches did ({LOAD_TRIES} tries): no shared graph time")
    return out


def _under_load(name: str, graphs: dict[str, StepGraph], streams: dict[str, torch.cuda.Stream],
                alone: dict[str, float], trials: int, margin: float) -> tuple[float, bool]:
    """Median seconds of ``name``'s graph with the others' queued to outlast it ``margin`` times,
    and whether they were all still running when its last timed launch ended."""
    window = (trials + 1) * alone[name] * len(graphs[name].chains) * margin
    done = {}
    for other, graph in graphs.items():
        if other != name:
            for _ in range(math.ceil(window / (alone[other] * len(graph.chains))) + 1):
                graph.launch(streams[other])
            done[other] = torch.cuda.Event()
            done[other].record(streams[other])
    stream = streams[name]
    graphs[name].launch(stream)  # warm, under load
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(trials)]
    for start, end in marks:  # queued back to back: no host gap between trials
        start.record(stream)
        graphs[name].launch(stream)
        end.record(stream)
    marks[-1][1].synchronize()
    covered = not any(event.query() for event in done.values())
    for other in done:
        streams[other].synchronize()
    return statistics.median(start.elapsed_time(end) / 1e3 for start, end in marks), covered
