"""Run a step under a plan, across devices, as a single CUDA graph (runs on GPUs).

Each device has a *replica*: the step captured on that device (its own weights, state and
activations at its own addresses). The plan's graph holds each launch as a copy of the node its
device's replica captured (so every kernel reads its own device's memory, with its own
parameters), added in the device's execution context — a green context's, to run on that
partition's SMs — and the copies of :func:`kernelfleet.runtime.transfers.transfers` between them
(``runtime/link.py``: memcpy nodes, optionally paced to an emulated link).

Order comes from ``runtime/schedule.py`` (checked race-free on the CPU by ``schedule.races``):
overlapping (a copy waits only for the bytes it moves) or conservative (a copy stalls both of its
devices). Several *slots* (micro-batches, each with replicas of its own) make one graph. Chained,
each stream — a device's compute, a link — runs slot after slot, so device A starts slot k+1 once
its part of slot k is done; free, the slots only share the devices and a device runs kernels of
several slots at once, which keeps both devices busy when a plan alternates between them within
a step. Optionally earlier slots' kernels get a higher launch priority, so the pipeline drains in
order instead of slots competing for SMs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import UsageError
from kernelfleet.kernels import driver
from kernelfleet.kernels.capture import Captured
from kernelfleet.kernels.ir import Program
from kernelfleet.kernels.replay import program_nodes
from kernelfleet.runtime.link import METHODS, LinkKernels, Throttle, add_copy
from kernelfleet.runtime.schedule import Node, schedule
from kernelfleet.runtime.transfers import AddressMap, Transfer


@dataclass
class Replica:
    captured: Captured
    program: Program
    context: Any = None  # where its launches run (a green context's CUcontext); None: the capture's

    @property
    def run_context(self) -> Any:
        return self.captured.context if self.context is None else self.context


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


def build(slots: list[Slot], method: str = "auto", throttle: Throttle | None = None, overlap: bool = True,
          priorities: bool = False, resident_state: bool = False, chain_slots: bool = True) -> Built:
    """One graph running every slot of a plan, instantiated; UsageError for a plan that does not
    fit its replicas. ``method``: a copy method of ``link.METHODS``, or "auto" for the first the
    driver accepts; ``throttle``: pace every copy to an emulated link; ``overlap``: the overlapping
    schedule, else the conservative one; ``priorities``: earlier slots first; ``resident_state``:
    state stays where the plan reads it (``transfers``); ``chain_slots``: each stream runs its slots
    one after another, else the slots only share the devices (kernels of several slots run at once
    on a device, as from several CUDA streams)."""
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
    graph = driver.create_graph()
    builder = _Builder(graph, method, throttle)
    try:
        least, greatest = driver.priority_range() if priorities else (0, 0)
        last: dict[str, list[Any]] = {}  # per stream, the graph nodes of its latest node: slot k+1 follows slot k
        orders = []
        for k, slot in enumerate(slots):
            priority = max(greatest, least - (len(slots) - 1 - k)) if priorities else None
            order = schedule(slot.replicas[slot.home].program, slot.assignment, slot.home, overlap, resident_state)
            last = builder.add_slot(slot.replicas, order, slot.home, last if chain_slots else {}, priority)
            orders.append(order)
        executable = driver.instantiate(graph)
    except Exception:
        driver.call("cuGraphDestroy", graph)
        builder.close()
        raise
    copies = [n.copy for order in orders for n in order if n.copy is not None]
    return Built(graph, executable, copies, sum(t.length_bytes for t in copies), sum(map(len, orders)),
                 len(slots), builder.method if copies else None, list(builder.kernels.values()))


class _Builder:
    """Adds slots of a plan to one graph, remembering the copy method the driver took."""

    def __init__(self, graph: Any, method: str, throttle: Throttle | None) -> None:
        self.graph, self.method, self.throttle = graph, method, throttle
        self.kernels: dict[int, LinkKernels] = {}  # by id of the destination replica

    def add_slot(self, replicas: dict[str, Replica], order: list[Node], home: str,
                 previous: dict[str, list[Any]], priority: int | None) -> dict[str, list[Any]]:
        base = replicas[home].program
        maps = {d: AddressMap(base, r.program) for d, r in replicas.items() if d != home}
        nodes = {d: program_nodes(r.captured) for d, r in replicas.items()}
        buffers = {b.id: b for b in base.buffers}

        def where(device: str, t: Transfer, seen_by: list[int | None]) -> int:
            """The copy's bytes in ``device``'s capture, as the launches ``seen_by`` (first
            preferred) address them there: the writer for the source, the reader for the
            destination (a range both only overlap in one capture is where each of them looks)."""
            address = buffers[t.buffer].address + t.offset_bytes
            if device == home:
                return address
            if t.writer is None:  # a step input: same buffer name in every capture
                return maps[device].translate_input(buffers[t.buffer].name, t.offset_bytes)
            return maps[device].translate(seen_by, address, t.length_bytes)

        made: list[list[Any]] = []
        latest = dict(previous)
        started: set[str] = set()
        for n in order:
            after = [g for d in n.deps for g in made[d]]
            if n.stream not in started:  # the first of its stream in this slot follows the last slot's
                after += previous.get(n.stream, [])
                started.add(n.stream)
            if n.launch is not None:
                replica = replicas[n.devices[0]]
                with driver.in_context(replica.run_context):
                    node = driver.add_copy_of(self.graph, replica.captured.nodes[nodes[n.devices[0]][n.launch]],
                                              after, replica.run_context)
                if priority is not None and driver.node_kind(node) == "kernel":
                    driver.set_priority(node, priority)
                made.append([node])
            else:
                t = n.copy
                made.append(self.copy(after, t, replicas[t.src], replicas[t.dst], where(t.dst, t, [t.reader, t.writer]),
                                      where(t.src, t, [t.writer, t.reader])))
            latest[n.stream] = made[-1]
        return latest

    def copy(self, after: list[Any], t: Transfer, source: Replica, target: Replica, dst: int, src: int) -> list[Any]:
        if id(target) not in self.kernels:
            self.kernels[id(target)] = LinkKernels(target.captured.context)
        kernels = self.kernels[id(target)]
        errors = []
        for how in [self.method] if self.method != "auto" else list(METHODS):
            try:
                if how == "kernel" and int(source.captured.context) != int(target.captured.context):
                    driver.enable_peer_access(target.captured.context, source.captured.context)  # it pulls
                made = [add_copy(how, self.graph, after, dst, src, t.length_bytes, kernels)]
                self.method = how
                break
            except driver.DriverError as exc:
                errors.append(f"{how}: {exc}")
        else:
            raise driver.DriverError(f"copy of {t.length_bytes} bytes {t.src} {src:#x} -> {t.dst} {dst:#x} (written "
                                     f"by launch {t.writer}, read by {t.reader}) refused: {'; '.join(errors)}")
        if self.throttle is not None:
            made.append(kernels.wait(self.graph, after, self.throttle.seconds(t.length_bytes)))
        return made

    def close(self) -> None:
        for k in self.kernels.values():
            k.close()


def run(built: Built, stream: int) -> None:
    driver.launch(built.executable, stream)


def release(built: Built) -> None:
    driver.destroy(built.graph, built.executable)
    for k in built.kernels:
        k.close()
