"""Run a step under a plan, across devices, as a single CUDA graph (runs on GPUs).

Each device has a *replica*: the step captured on that device (its own weights, state and
activations at its own addresses). The plan's graph holds each launch as a copy of the node its
device's replica captured (so every kernel reads its own device's memory, with its own
parameters), added in the device's execution context — a green context's, to run on that
partition's SMs — and the copies of :func:`kernelfleet.plan.transfers.transfers` between them
(``runtime/link.py``: memcpy nodes, optionally paced to an emulated link). Where the devices
captured different kernels, the plan places units (``graph/units.py``) and each unit is the chain
of the launches its device's replica made for it.

Order comes from ``plan/schedule.py`` (checked race-free on the CPU by ``schedule.races``, and
to hand every launch the bytes a one-device run would by ``delivery.stale_reads``, before the graph
is built):
overlapping (a copy waits only for the bytes it moves) or conservative (a copy stalls both of its
devices). Several *slots* (micro-batches, each with replicas of its own) make one graph; how they
share each device's and link's stream — one after another, freely, or in a list-scheduled order
that lets a device start the next slot while the other works on this one — is
``plan/slots.py``'s, which also predicts the graph's time. Optionally earlier slots' kernels get
a higher launch priority.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelfleet.errors import UsageError
from kernelfleet.graph.units import UnitView
from kernelfleet.kernels.cuda.doorway import DriverError
from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver
from kernelfleet.kernels.ir import Program
from kernelfleet.kernels.raw import program_nodes
from kernelfleet.plan.delivery import stale_reads
from kernelfleet.plan.schedule import Node, races, schedule
from kernelfleet.plan.slots import SlotNode, pipeline
from kernelfleet.plan.transfers import AddressMap, Transfer, UnitAddressMap
from kernelfleet.runtime.link import METHODS, LinkKernels, Throttle, add_copy

if TYPE_CHECKING:  # a type only: the executor never imports torch
    from kernelfleet.kernels.cuda.capture import Captured


@dataclass
class Replica:
    """A device's capture of the step and the program plans place: its assembled launches, or
    with ``units`` (devices that captured other kernels) its unit program, ``units.program``."""

    captured: Captured
    program: Program
    context: Any = None  # where its launches run (a green context's CUcontext); None: the capture's
    units: UnitView | None = None
    decode: Any = None  # the step's workloads.steps.Decode where it is a decode step (the multi-step gate)

    @property
    def run_context(self) -> Any:
        return self.captured.context if self.context is None else self.context

    def node_chains(self) -> list[list[int]]:
        """The graph nodes of each placed launch (of each unit, in unit mode), in capture order."""
        if self.units is not None:
            return self.units.nodes()
        return [[n] for n in program_nodes(self.captured.raw)]


@dataclass
class Slot:
    """One micro-batch of a plan: a replica per device, where each launch runs, and the device
    that holds the step's inputs and gets its outputs back."""

    replicas: dict[str, Replica]
    assignment: list[str]
    home: str


@dataclass
class Built:
    graph: Any
    executable: Any
    copies: list[Transfer]  # of all slots
    copy_bytes: int  # of all slots
    nodes: int  # of all slots
    slots: int
    method: str | None  # how copies were made (link.METHODS); None when the plan copies nothing
    kernels: list[LinkKernels]
    combined: list[SlotNode]  # the graph as data (plan/slots.py), e.g. for slots.makespan
    driver: CudaDriver = CUDA  # the one that made the graph: it runs and releases it


def plan_graph(slots: list[tuple[Program, list[str], str]], overlap: bool = True, resident_state: bool = False,
               slot_mode: str = "sequential", seconds: Callable[[int, Node], float] | None = None,
               ) -> tuple[list[list[Node]], list[SlotNode]]:
    """Each slot's graph (its home program, assignment and home device; ``schedule.schedule``),
    checked race-free and to deliver every byte (``delivery.stale_reads``), and the slots as one
    list (``slots.pipeline``); UsageError on a race or a stale read."""
    orders = [schedule(program, assignment, home, overlap, resident_state) for program, assignment, home in slots]
    for k, ((program, assignment, home), order) in enumerate(zip(slots, orders)):
        found = races(program, assignment, order)
        if found:
            raise UsageError(f"slot {k}: {len(found)} races in the plan graph, first: {found[0]}")
        found = stale_reads(program, assignment, home, order, resident_state)
        if found:
            raise UsageError(f"slot {k}: {len(found)} stale reads in the plan graph, first: {found[0]}")
    return orders, pipeline(orders, slot_mode, seconds)


def build(slots: list[Slot], method: str = "auto", throttle: Throttle | None = None, overlap: bool = True,
          priorities: bool = False, resident_state: bool = False, slot_mode: str = "sequential",
          seconds: Callable[[int, Node], float] | None = None, driver: CudaDriver = CUDA,
          copy_cap_bytes: int | None = None) -> Built:
    """One graph running every slot of a plan, instantiated; UsageError for a plan that does not
    fit its replicas or whose graph has a data race (``schedule.races``, checked on the CPU before
    anything reaches the driver). ``method``: a copy method of ``link.METHODS``, or "auto" for the first the
    driver accepts; ``throttle``: pace every copy to an emulated link; ``overlap``: the overlapping
    schedule, else the conservative one; ``priorities``: earlier slots first; ``resident_state``:
    state stays where the plan reads it (``transfers``); ``slot_mode``: how slots share streams
    (``slots.MODES``; ``scheduled`` needs ``seconds(slot, node)``, an estimate of each node);
    ``driver``: what builds it (``null.NullDriver`` records it on a CPU); ``copy_cap_bytes``: every
    copy moves at most this many bytes (an ablation that computes wrong outputs: ``bench.edge_cost``
    times a plan's edges without their bytes so)."""
    if not slots:
        raise UsageError("a plan needs at least one slot of replicas")
    for slot in slots:
        if slot.home not in slot.replicas:
            raise UsageError(f"home device {slot.home!r} has no replica")
        missing = sorted(set(slot.assignment) - set(slot.replicas))
        if missing:
            raise UsageError(f"the plan uses devices without a replica: {', '.join(missing)}")
    if method != "auto" and method not in METHODS:
        raise UsageError(f"unknown copy method {method!r}; expected auto or one of {', '.join(METHODS)}")
    orders, combined = plan_graph([(s.replicas[s.home].program, s.assignment, s.home) for s in slots], overlap,
                                  resident_state, slot_mode, seconds)
    graph = driver.create_graph()
    builder = _Builder(graph, method, throttle, driver, copy_cap_bytes)
    try:
        least, greatest = driver.priority_range() if priorities else (0, 0)
        places = [Places(s.home, {d: r.program for d, r in s.replicas.items()}, unit_views(s.replicas)) for s in slots]
        launch_nodes = [{d: r.node_chains() for d, r in s.replicas.items()} for s in slots]
        made: list[list[Any]] = []
        for x in combined:
            priority = max(greatest, least - (len(slots) - 1 - x.slot)) if priorities else None
            after = [g for d in x.deps for g in made[d]]
            made.append(builder.add(slots[x.slot], places[x.slot], launch_nodes[x.slot], x.node, after, priority))
        executable = driver.instantiate(graph)
    except Exception:
        driver.destroy(graph)
        builder.close()
        raise
    copies = [n.copy for order in orders for n in order if n.copy is not None]
    return Built(graph, executable, copies, sum(t.length_bytes for t in copies), len(combined),
                 len(slots), builder.method if copies else None, list(builder.kernels.values()), combined, driver)


def unit_views(replicas: dict[str, Replica]) -> dict[str, UnitView] | None:
    """The replicas' unit views where every one has them (devices with different kernels), else None."""
    views = {d: r.units for d, r in replicas.items() if r.units is not None}
    if views and len(views) != len(replicas):
        raise UsageError("some replicas place units and some launches: capture every device the same way")
    return views or None


class Places:
    """Where a slot's copied bytes are in each device's capture, given every device's program of
    the slot (the home one's buffers and launches define the copies) and, where the devices
    captured different kernels, their unit views."""

    def __init__(self, home: str, programs: dict[str, Program], units: dict[str, UnitView] | None = None) -> None:
        self.home = home
        base = programs[home]
        self.maps: dict[str, AddressMap | UnitAddressMap] = {
            d: AddressMap(base, p) if units is None else UnitAddressMap(units[home], units[d])
            for d, p in programs.items() if d != home}
        self.buffers = {b.id: b for b in base.buffers}

    def where(self, device: str, t: Transfer, seen_by: list[int | None]) -> int:
        """The copy's bytes in ``device``'s capture, as the launches ``seen_by`` (first preferred)
        address them there: the writer for the source, the reader for the destination."""
        address = self.buffers[t.buffer].address + t.offset_bytes
        if device == self.home:
            return address
        if t.writer is None:  # a step input: same buffer name in every capture
            return self.maps[device].translate_input(self.buffers[t.buffer].name, t.offset_bytes)
        return self.maps[device].translate(seen_by, address, t.length_bytes)


def add_launch(graph: Any, replica: Replica, chains: list[list[int]], launch: int, after: list[Any],
               driver: CudaDriver = CUDA, priority: int | None = None) -> Any:
    """Copies of ``replica``'s captured nodes of ``launch`` (``chains``: ``Replica.node_chains``),
    one after another, added to ``graph`` by ``driver`` in the replica's execution context after
    ``after``, kernels at launch ``priority`` where given; the last of them (what a later node
    waits for)."""
    with driver.in_context(replica.run_context):
        for node in chains[launch]:
            try:
                after = [driver.add_copy_of(graph, replica.captured.nodes[node], after, replica.run_context)]
            except DriverError as exc:  # which kernel the driver would not place: the one thing to look at
                step = replica.program.launches[launch]
                raise DriverError(f"launch {launch} ({step.op or 'no ATen op'}, kernel {step.name[:120]}): {exc}",
                                  exc.name) from None
            if priority is not None and driver.node_kind(after[0]) == "kernel":
                driver.set_priority(after[0], priority)
    return after[0]


class _Builder:
    """Adds the plan's nodes to one graph, remembering the copy method the driver took."""

    def __init__(self, graph: Any, method: str, throttle: Throttle | None, driver: CudaDriver,
                 cap: int | None = None) -> None:
        self.graph, self.method, self.throttle, self.driver, self.cap = graph, method, throttle, driver, cap
        self.kernels: dict[int, LinkKernels] = {}  # by id of the destination replica

    def add(self, slot: Slot, places: Places, launch_nodes: dict[str, list[int]], n: Node, after: list[Any],
            priority: int | None) -> list[Any]:
        if n.launch is not None:
            device = n.devices[0]
            try:
                return [add_launch(self.graph, slot.replicas[device], launch_nodes[device], n.launch, after,
                                   self.driver, priority)]
            except DriverError as exc:
                raise DriverError(f"device {device}: {exc}", exc.name) from None
        t = n.copy
        return self.copy(after, t, slot.replicas[t.src], slot.replicas[t.dst],
                         places.where(t.dst, t, [t.reader, t.writer]), places.where(t.src, t, [t.writer, t.reader]))

    def copy(self, after: list[Any], t: Transfer, source: Replica, target: Replica, dst: int, src: int) -> list[Any]:
        if id(target) not in self.kernels:
            self.kernels[id(target)] = LinkKernels(target.captured.context, self.driver)
        kernels = self.kernels[id(target)]
        errors = []
        length = t.length_bytes if self.cap is None else min(self.cap, t.length_bytes)
        for how in [self.method] if self.method != "auto" else list(METHODS):
            try:
                if how == "kernel" and int(source.captured.context) != int(target.captured.context):
                    self.driver.enable_peer_access(target.captured.context, source.captured.context)  # it pulls
                made = [add_copy(how, self.graph, after, dst, src, length, kernels)]
                self.method = how
                break
            except DriverError as exc:
                errors.append(f"{how}: {exc}")
        else:
            raise DriverError(f"copy of {length} bytes {t.src} {src:#x} -> {t.dst} {dst:#x} (written "
                                     f"by launch {t.writer}, read by {t.reader}) refused: {'; '.join(errors)}")
        if self.throttle is not None:
            made.append(kernels.wait(self.graph, after, self.throttle.seconds(t.length_bytes)))
        return made

    def close(self) -> None:
        for k in self.kernels.values():
            k.close()


def run(built: Built, stream: int) -> None:
    """Launch the graph on ``stream``, a stream of the home device's primary context.

    Not the legacy default stream (handle 0): that is the stream of whichever context is current on
    this thread, and the executor's green contexts come and go, so the graph could land on another
    device than the events that time it (bench disagg once timed some graphs at 0.02 ms that way).
    """
    if not stream:
        raise UsageError("the executor launches on a stream of its own, not the legacy default stream (0)")
    built.driver.launch(built.executable, stream)


def release(built: Built) -> None:
    """Free the graph, its executable and the link kernels it loaded."""
    built.driver.destroy(built.graph, built.executable)
    for k in built.kernels:
        k.close()
