"""Run a plan across processes, one per device, with NCCL between them (runs on GPUs; torchrun).

The single-process executor (``runtime/executor.py``) builds one CUDA graph over every device and
moves bytes with peer copies. Between processes (and so between hosts) each rank holds only its
own device's replicas and runs only its own part of the plan's graph (``slots.pipeline``, the
same list on every rank, since every rank computes it from the same home programs and plan):

* its launches, grouped into *segments* — runs of consecutive launches of one slot with no copy
  of this rank between them — each instantiated as a CUDA graph of copies of its captured nodes,
  in the device profile's execution context, on the slot's compute stream;
* each copy it takes part in, as an NCCL ``send`` (its source) or ``recv`` (its destination) of
  the exact byte range, on one copy stream, through tensors aliasing the capture's memory.

:func:`rank_ops` is that part as plain data. A node's dependencies that live on this rank become
waits on the CUDA events of earlier ops; those on another rank need no wait here, since only a
copy depends on another rank's node, and NCCL's rendezvous holds the transfer until both ranks have
reached it, each after its own dependencies. Every rank issues its ops in the list's order, so the
k-th copy between two ranks is the k-th on both: sends and receives match, and as every op waits
only for ops earlier in the list, no rank can wait on one that waits on it (``tests/unit/
test_distributed.py`` simulates every rank of real plans to check both).

Where the devices captured different kernels (each rank with its own), a plan places units
(``graph/units.py``): a segment holds its units' chains of captured nodes, and a copy's bytes are
found in each capture through the devices' unit views, as in the one-process executor.

Against the single graph this pays a host launch per segment and per copy, and NCCL serialises a
pair's copies on one stream in each direction's common order; it is what crosses hosts.

A link can be paced as in ``runtime/link.py``: the receiving rank runs a ``kf_wait`` of
``latency + bytes / bandwidth`` on a pace stream from the moment its copy stream reaches the copy,
and its copy stream waits for that too, so a copy ends no sooner than the emulated link allows and
the next one queues behind it. Priorities come from the streams the caller passes.

Weights can be placed where the plan puts them (:func:`weights_read`): a rank then keeps only the
weights its own launches read and frees the rest after capture (the capture itself needs the whole
step on each GPU; placement lowers what a rank holds while it serves, not its peak).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.graph.units import UnitView
from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver
from kernelfleet.kernels.ir import Program, merged_ranges
from kernelfleet.plan.schedule import Node
from kernelfleet.plan.slots import SlotNode
from kernelfleet.runtime.executor import Places, Replica, add_launch, plan_graph
from kernelfleet.runtime.link import LinkKernels, Throttle


@dataclass(frozen=True, slots=True)
class RankOp:
    """One thing a rank issues: a segment of launches, or its side of one copy."""

    kind: str  # "segment", "send" or "recv"
    slot: int
    items: tuple[int, ...]  # indices into the combined list: a segment's launches, a copy's one node
    peer: str | None  # the other device of a copy
    waits: tuple[int, ...]  # earlier ops of this rank, on other streams, whose end it waits for

    @property
    def stream(self) -> str:
        return _stream(self.kind, self.slot)


def _stream(kind: str, slot: int) -> str:
    """The stream an op runs on: its slot's compute stream for a segment, the copy stream else."""
    return f"compute:{slot}" if kind == "segment" else "copy"


def local(node: Node, device: str) -> bool:
    """Whether ``device``'s rank takes part in ``node``: a launch on it, or a copy from or to it."""
    return device in node.devices


def rank_ops(combined: list[SlotNode], device: str) -> list[RankOp]:
    """``device``'s part of the plan's graph, in list order (module docstring)."""
    op_of: dict[int, int] = {}  # combined index -> op index, for this rank's nodes
    ops: list[dict] = []
    for k, x in enumerate(combined):
        n = x.node
        if not local(n, device):
            continue
        if n.launch is not None:
            last = ops[-1] if ops else None
            if last is None or last["kind"] != "segment" or last["slot"] != x.slot:
                ops.append({"kind": "segment", "slot": x.slot, "items": [], "peer": None, "deps": set()})
        else:
            src, dst = n.copy.src, n.copy.dst
            ops.append({"kind": "send" if src == device else "recv", "slot": x.slot, "items": [],
                        "peer": dst if src == device else src, "deps": set()})
        op = ops[-1]
        op["items"].append(k)
        op["deps"].update(op_of[d] for d in x.deps if local(combined[d].node, device))
        op_of[k] = len(ops) - 1
    out: list[RankOp] = []
    for i, op in enumerate(ops):
        stream = _stream(op["kind"], op["slot"])
        waits = tuple(sorted(w for w in op["deps"] if w != i and out[w].stream != stream))  # a stream keeps its order
        out.append(RankOp(op["kind"], op["slot"], tuple(op["items"]), op["peer"], waits))
    return out


def weights_read(program: Program, assignment: list[str], device: str) -> list[tuple[int, int]]:
    """[start, end) address ranges, in ``program``'s capture, of the weight buffers that the
    launches ``assignment`` puts on ``device`` read (merged, sorted): what that device must hold."""
    buffers = {b.id: b for b in program.buffers}
    return merged_ranges([(buffers[a.buffer].address, buffers[a.buffer].address + buffers[a.buffer].size_bytes)
                          for launch in program.launches if assignment[launch.index] == device
                          for a in launch.accesses if buffers[a.buffer].role == "weight"])


@dataclass
class RankSlot:
    """One micro-batch as one rank sees it: every device's program of the slot (gathered from the
    ranks; the home one defines the copies), this rank's replica, where each launch runs, and the
    device that holds the step's inputs and gets its outputs; where the devices captured different
    kernels, every device's unit view (``graph/units.py``: the programs are theirs, and a copy's
    bytes are found through them)."""

    programs: dict[str, Program]
    replica: Replica
    assignment: list[str]
    home: str
    units: dict[str, UnitView] | None = None


@dataclass
class RankBuilt:
    device: str
    ops: list[RankOp]
    graphs: dict[int, tuple[Any, Any]]  # op index -> (graph, executable), for segments
    buffers: dict[int, Any] = field(default_factory=dict)  # op index -> tensor aliasing the copied bytes
    copy_bytes: int = 0
    combined: list[SlotNode] = field(default_factory=list)
    throttle: Throttle | None = None
    link: LinkKernels | None = None  # kf_wait, loaded where a throttle paces the copies received
    waited: frozenset[int] = frozenset()  # ops another op waits for: they record an event
    driver: CudaDriver = CUDA  # the one that made the graphs: it runs and releases them


def build_rank(slots: list[RankSlot], device: str, alias: Callable[[int, int], Any], throttle: Throttle | None = None,
               driver: CudaDriver = CUDA, **options: Any) -> RankBuilt:
    """This rank's ops, with a CUDA graph per segment and an aliasing tensor per copy
    (``alias(address, length)`` on this rank's GPU, e.g. ``replay.device_bytes``); ``throttle``
    paces the copies it receives; ``driver`` builds the graphs (``null.NullDriver`` on a CPU);
    ``options`` as for ``executor.plan_graph`` (state resident by default)."""
    options.setdefault("resident_state", True)
    _, combined = plan_graph([(s.programs[s.home], s.assignment, s.home) for s in slots], **options)
    ops = rank_ops(combined, device)
    built = RankBuilt(device, ops, {}, combined=combined, throttle=throttle,
                      waited=frozenset(w for op in ops for w in op.waits), driver=driver)
    if throttle is not None and any(op.kind == "recv" for op in ops):
        built.link = LinkKernels(driver.current_context(), driver)
    places = [Places(s.home, s.programs, s.units) for s in slots]
    launch_nodes: dict[int, list[list[int]]] = {}
    try:
        for i, op in enumerate(ops):
            slot = slots[op.slot]
            if op.kind == "segment":
                if op.slot not in launch_nodes:
                    launch_nodes[op.slot] = slot.replica.node_chains()
                graph = driver.create_graph()
                built.graphs[i] = (graph, None)
                made: dict[int, Any] = {}
                for k in op.items:
                    after = [made[d] for d in combined[k].deps if d in made]
                    made[k] = add_launch(graph, slot.replica, launch_nodes[op.slot], combined[k].node.launch, after,
                                         driver)
                built.graphs[i] = (graph, driver.instantiate(graph))
                continue
            t = combined[op.items[0]].node.copy
            seen_by = [t.writer, t.reader] if op.kind == "send" else [t.reader, t.writer]
            built.buffers[i] = alias(places[op.slot].where(device, t, seen_by), t.length_bytes)
            built.copy_bytes += t.length_bytes
    except Exception:
        release_rank(built)
        raise
    return built


def release_rank(built: RankBuilt) -> None:
    """Free the rank's graphs (instantiated or not) and its link kernels."""
    for graph, executable in built.graphs.values():
        built.driver.destroy(graph, executable)
    built.graphs.clear()
    if built.link is not None:
        built.link.close()
        built.link = None


def run_rank(built: RankBuilt, compute: dict[int, Any], copy: Any, rank_of: dict[str, int], pace: Any = None) -> None:
    """Issue this rank's ops: segments on their slot's stream of ``compute`` (torch streams of this
    rank's GPU, by slot), copies through NCCL on ``copy``; ``rank_of``: each device's rank;
    ``pace``: the stream a throttle's waits run on. Returns once all is enqueued; the caller
    synchronises."""
    import torch
    import torch.distributed as dist

    events: dict[int, Any] = {}
    for i, op in enumerate(built.ops):
        stream = compute[op.slot] if op.kind == "segment" else copy
        for w in op.waits:
            stream.wait_event(events[w])
        if op.kind == "segment":
            built.driver.launch(built.graphs[i][1], stream.cuda_stream)
        else:
            paced = _pace(built, i, stream, pace) if op.kind == "recv" and built.link is not None else None
            with torch.cuda.stream(stream):  # NCCL waits for this stream, and .wait() makes it wait for NCCL
                (dist.isend if op.kind == "send" else dist.irecv)(built.buffers[i], rank_of[op.peer]).wait()
            if paced is not None:
                stream.wait_event(paced)
        if i in built.waited:
            events[i] = torch.cuda.Event()
            events[i].record(stream)


def _pace(built: RankBuilt, i: int, copy: Any, pace: Any) -> Any:
    """Start the emulated link's time for op ``i`` when ``copy`` reaches it; the event of its end."""
    import torch

    reached = torch.cuda.Event()
    reached.record(copy)
    pace.wait_event(reached)
    built.link.wait_on(pace.cuda_stream, built.throttle.seconds(built.buffers[i].numel()))
    paced = torch.cuda.Event()
    paced.record(pace)
    return paced
