"""Replaying single nodes of a captured graph, alone or repeated, through a driver."""

from __future__ import annotations

from typing import Any

from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver


class NodeReplayer:
    """Replays single nodes of a captured graph, alone or repeated, on a chosen stream.

    ``one(i)`` runs node ``i`` by itself (so a step can be replayed node by node with its real
    state), ``repeated(i, n)`` runs ``n`` copies of it back to back (timing without the launch
    overhead of a graph per kernel). Both launch a small graph holding copies of the node, built
    in the capture's context. (Toggling nodes of one instantiation of the whole graph with
    ``cuGraphNodeSetEnabled`` faulted on the H200 for graphs of ~2,000 nodes; small graphs did
    not.) Every handle is released by ``close``.
    """

    def __init__(self, graph_nodes: list[Any], context: Any, driver: CudaDriver = CUDA) -> None:
        """``context``: where the small graphs are built and so run — the capture's context, or a
        green context's, to run the nodes on that partition's SMs; ``driver``: the one that read
        ``graph_nodes``."""
        self.nodes, self.context, self.driver = graph_nodes, context, driver
        self._graphs: dict[tuple[int, int, tuple[int, ...]], tuple[Any, Any]] = {}

    def one(self, index: int, stream: int, prelude: tuple[int, ...] = ()) -> None:
        self.repeated(index, 1, stream, prelude)

    def repeated(self, index: int, count: int, stream: int, prelude: tuple[int, ...] = ()) -> None:
        """``count`` copies of node ``index``, each after copies of the nodes ``prelude`` (the
        memsets that reset its state, ``replay.preludes``)."""
        key = (index, count, prelude)
        if key not in self._graphs:  # built in the capture's context, whatever stream it then runs on
            with self.driver.in_context(self.context):
                self._graphs[key] = self._repeat_graph([self.nodes[i] for i in (*prelude, index)], count)
        self.driver.launch(self._graphs[key][1], stream)

    def close(self) -> None:
        for graph, exe in self._graphs.values():
            self.driver.destroy(graph, exe)
        self._graphs.clear()

    def _repeat_graph(self, nodes: list[Any], count: int) -> tuple[Any, Any]:
        """A graph of ``count`` copies of the sequence ``nodes`` in one chain, and its instantiation."""
        graph = self.driver.create_graph()
        previous: list[Any] = []
        for _ in range(count):
            for node in nodes:
                previous = [self.driver.add_copy_of(graph, node, previous, self.context)]
        return graph, self.driver.instantiate(graph)
