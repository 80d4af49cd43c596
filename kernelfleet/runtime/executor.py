"""Run one step under a plan, across devices, as a single CUDA graph (runs on GPUs).

Each device has a *replica*: the step captured on that device (its own weights, state and
activations at its own addresses). The plan's graph holds, in capture order, each launch as a copy
of the node its device's replica captured (so every kernel reads its own device's memory, with its
own parameters), and the copies of :func:`kernelfleet.runtime.transfers.transfers` between them.

Order (``runtime/schedule.py``, checked race-free on the CPU by ``schedule.races``): each device
keeps the original order of its launches; a copy joins the order of both its source and its
destination device at the reader's position (so its source bytes cannot be overwritten before it
reads them, nor its destination bytes while an earlier launch still needs them). Correct and
conservative; several steps in flight (micro-batches, one graph per slot) is what hides the
copies, and comes next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import UsageError
from kernelfleet.kernels import driver
from kernelfleet.kernels.capture import Captured
from kernelfleet.kernels.ir import Program
from kernelfleet.kernels.replay import program_nodes
from kernelfleet.runtime.schedule import schedule
from kernelfleet.runtime.transfers import AddressMap, Transfer


@dataclass
class Replica:
    captured: Captured
    program: Program


@dataclass
class Built:
    graph: Any
    executable: Any
    copies: list[Transfer]
    copy_bytes: int
    nodes: int


def build(replicas: dict[str, Replica], assignment: list[str], home: str) -> Built:
    """The plan's graph (``schedule.schedule``), instantiated; UsageError for a plan that does not
    fit the replicas."""
    if home not in replicas:
        raise UsageError(f"home device {home!r} has no replica")
    missing = sorted(set(assignment) - set(replicas))
    if missing:
        raise UsageError(f"the plan uses devices without a replica: {', '.join(missing)}")
    base = replicas[home].program
    maps = {d: AddressMap(base, r.program) for d, r in replicas.items() if d != home}
    order = schedule(base, assignment, home)
    nodes = {d: program_nodes(r.captured) for d, r in replicas.items()}

    buffers = {b.id: b for b in base.buffers}

    def where(device: str, t: Transfer) -> int:
        address = buffers[t.buffer].address + t.offset_bytes
        if device == home:
            return address
        if t.writer is None:  # a step input: same buffer name in every capture
            return maps[device].translate_input(buffers[t.buffer].name, t.offset_bytes)
        return maps[device].translate([t.writer, t.reader], address, t.length_bytes)

    graph = driver.create_graph()
    made: list = []
    for n in order:
        after = [made[d] for d in n.deps]
        if n.launch is not None:
            r = replicas[n.devices[0]].captured
            made.append(driver.add_copy_of(graph, r.nodes[nodes[n.devices[0]][n.launch]], after, r.context))
            continue
        t = n.copy
        dst, src = where(t.dst, t), where(t.src, t)
        try:
            made.append(driver.add_copy(graph, after, dst, src, t.length_bytes, replicas[t.dst].captured.context))
        except driver.DriverError as exc:
            raise driver.DriverError(f"{exc}: copy of {t.length_bytes} bytes {t.src} {src:#x} -> {t.dst} {dst:#x} "
                                     f"(written by launch {t.writer}, read by {t.reader})") from exc
    copies = [n.copy for n in order if n.copy is not None]
    return Built(graph, driver.instantiate(graph), copies, sum(t.length_bytes for t in copies), len(order))


def run(built: Built, stream: int) -> None:
    driver.launch(built.executable, stream)


def release(built: Built) -> None:
    driver.destroy(built.graph, built.executable)
