"""What a copy between two devices costs inside a CUDA graph, measured as the executor builds it.

The executor (``runtime/executor.py``) puts a plan's copies into the step's graph as memcpy nodes
added in the destination's capture context (``runtime/link.add_copy``), between copies of the
captured kernels added in each device's own context (a green context's, for a partition). So
this builds graphs of exactly those nodes between two devices ``a`` and ``b`` and times them
(``costs/links.py`` says what the figures mean):

* **queued** (per size): ``copies`` copies a -> b, each after the one before;
* **kernels**: ``copies`` kernels on a, then as many on b (one switch between the devices);
* **alternating**: the same kernels taking turns, a, b, a, ... each after the one before: the
  difference to *kernels*, over the ``2 copies - 2`` extra switches, is the wait a dependency
  across devices adds;
* **between** (per size): the alternating kernels with a copy before each switch (a -> b, then
  b -> a): each copy's own time is what the graph took beyond *kernels*, per copy, less the two
  waits around it;
* **beside**: ``copies`` kernels on a, the first half of them each with a copy a -> b of the
  smallest size branching off (nothing waits for it), against the same kernels alone: what a copy
  taking a kernel's bytes costs the chain that goes on (the fork), per copy. The second half of the
  chain outlasts the last copy, so the graph ends with a kernel.

The kernel is one small captured kernel per GPU (an elementwise add: a few µs), the same on both
devices, so its own time cancels out of every difference. Fixed costs and waits that noise makes
negative are kept at 0. Times come from ``time_graph`` (an instantiated graph -> seconds of one
launch): on a GPU, :func:`graph_timer`; on a CPU a twin of the driver (``NullDriver``) builds the
same graphs and a test times them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelfleet.costs.links import LinkFit, MeasuredLink
from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver

# Bytes of the copies timed: the plans of the H200 run moved 0.4-4 KB a copy (12-47 copies of
# 13-89 KB a request, docs/validation/place-h200-pairs.md), their inputs up to a few hundred KB.
SIZES_BYTES = (256, 2048, 16384, 131072, 1 << 20)
COPIES = 16  # copies (and kernels per device) in each graph: per-copy figures are its time / COPIES


@dataclass(frozen=True)
class End:
    """One device of the link as the executor sees it: ``context`` its kernels run in (a green
    context's; the capture's for a whole GPU), ``copy_context`` the copies into it are added in
    (its capture's, as ``runtime/link.add_copy`` adds them), ``kernel`` a captured kernel node,
    ``buffer`` the address of at least the largest size's bytes on its GPU."""

    name: str
    context: Any
    copy_context: Any
    kernel: Any
    buffer: int


class LinkGraphs:
    """Builds, instantiates, times and frees the graphs of the module docstring, by ``driver``."""

    def __init__(self, a: End, b: End, time_graph: Callable[[Any], float], driver: CudaDriver = CUDA,
                 copies: int = COPIES) -> None:
        if copies < 2:
            raise UsageError(f"a link measurement needs at least 2 copies a graph, got {copies}")
        self.a, self.b, self.time_graph, self.driver, self.copies = a, b, time_graph, driver, copies

    def _kernel(self, graph: Any, end: End, after: list[Any]) -> list[Any]:
        with self.driver.in_context(end.context):
            return [self.driver.add_copy_of(graph, end.kernel, after, end.context)]

    def _copy(self, graph: Any, src: End, dst: End, length: int, after: list[Any]) -> list[Any]:
        return [self.driver.add_copy(graph, after, dst.buffer, src.buffer, length, dst.copy_context)]

    def _timed(self, build: Callable[[Any], None]) -> float:
        graph = self.driver.create_graph()
        executable = None
        try:
            build(graph)
            executable = self.driver.instantiate(graph)
            return self.time_graph(executable)
        finally:
            self.driver.destroy(graph, executable)

    def queued(self, length: int) -> float:
        """Seconds per copy of ``copies`` chained copies a -> b of ``length`` bytes."""
        def build(graph: Any) -> None:
            after: list[Any] = []
            for _ in range(self.copies):
                after = self._copy(graph, self.a, self.b, length, after)

        return self._timed(build) / self.copies

    def kernels(self, alternate: bool, length: int | None = None) -> float:
        """Seconds of ``copies`` kernels on each device, a's first then b's, or taking turns
        (``alternate``), with a copy of ``length`` bytes before each switch where given."""
        def build(graph: Any) -> None:
            order = [self.a, self.b] * self.copies if alternate else [self.a] * self.copies + [self.b] * self.copies
            after: list[Any] = []
            for k, end in enumerate(order):
                if k and end is not order[k - 1] and length is not None:
                    after = self._copy(graph, order[k - 1], end, length, after)
                after = self._kernel(graph, end, after)

        return self._timed(build)

    def beside(self, forks: int, length: int) -> float:
        """Seconds of ``copies`` kernels on a, each of the first ``forks`` with a copy a -> b of
        ``length`` bytes branching off."""
        def build(graph: Any) -> None:
            after: list[Any] = []
            for k in range(self.copies):
                after = self._kernel(graph, self.a, after)
                if k < forks:
                    self._copy(graph, self.a, self.b, length, after)

        return self._timed(build)

    def measure(self, sizes: tuple[int, ...] = SIZES_BYTES) -> MeasuredLink:
        """The link between the two ends (module docstring)."""
        if len(set(sizes)) < 2:
            raise UsageError(f"a bandwidth needs copies of at least two sizes, got {list(sizes)}")
        one_switch, alternating = self.kernels(False), self.kernels(True)
        switches = 2 * self.copies - 1  # of the alternating graph
        wait = max(0.0, (alternating - one_switch) / (switches - 1))
        between = [max(0.0, (self.kernels(True, n) - one_switch + wait) / switches - 2 * wait) for n in sizes]
        queued = [self.queued(n) for n in sizes]
        forks = self.copies // 2
        fork = max(0.0, (self.beside(forks, min(sizes)) - self.beside(0, min(sizes))) / forks)
        return MeasuredLink(self.a.name, self.b.name, fit(sizes, between), fit(sizes, queued), wait, fork)


def fit(sizes: tuple[int, ...], seconds: list[float]) -> LinkFit:
    """``seconds`` against ``sizes`` by least squares: the intercept (kept at 0 or above) is the
    fixed cost per copy, one over the slope the bandwidth. UsageError where the times do not grow
    with the bytes (nothing to take a bandwidth from)."""
    n = len(sizes)
    mean_x, mean_y = sum(sizes) / n, sum(seconds) / n
    spread = sum((x - mean_x) ** 2 for x in sizes)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds)) / spread
    if not slope > 0:
        raise UsageError(f"copies of {list(sizes)} bytes took {[f'{s * 1e6:.2f}' for s in seconds]} µs: the time does "
                         "not grow with the bytes, so no bandwidth follows; measure again with larger sizes")
    return LinkFit(max(0.0, mean_y - slope * mean_x), 1 / slope, list(sizes), list(seconds))


def graph_timer(stream: Any, trials: int = 20, driver: CudaDriver = CUDA) -> Callable[[Any], float]:
    """Median seconds of one launch of an instantiated graph on ``stream`` (a torch stream), after one
    launch that warms it (runs on a GPU)."""
    from kernelfleet.profile.timing import median_seconds

    def seconds(executable: Any) -> float:
        driver.launch(executable, stream.cuda_stream)
        return median_seconds(lambda: driver.launch(executable, stream.cuda_stream), stream, trials)

    return seconds
