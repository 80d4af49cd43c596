"""Run one step under a plan, across devices, as a single CUDA graph (runs on GPUs).

Each device has a *replica*: the step captured on that device (its own weights, state and
activations at its own addresses). The plan's graph holds, in capture order, each launch as a copy
of the node its device's replica captured (so every kernel reads its own device's memory, with its
own parameters), and the copies of :func:`kernelfleet.runtime.transfers.transfers` between them.

Order: each device keeps the original order of its launches; a copy joins the order of both its
source and its destination device at the reader's position (so its source bytes cannot be
overwritten before it reads them, nor its destination bytes while an earlier launch still needs
them). That is correct by construction and conservative; several steps in flight (micro-batches,
one graph per slot) is what hides the copies, and comes next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import UsageError
from kernelfleet.kernels import driver
from kernelfleet.kernels.capture import Captured
from kernelfleet.kernels.ir import Program
from kernelfleet.kernels.replay import program_nodes
from kernelfleet.runtime.transfers import START, AddressMap, Transfer, transfers


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
    notes: list[str] = field(default_factory=list)


def build(replicas: dict[str, Replica], assignment: list[str], home: str) -> Built:
    """The plan's graph, instantiated; UsageError for a plan that does not fit the replicas."""
    if home not in replicas:
        raise UsageError(f"home device {home!r} has no replica")
    missing = sorted(set(assignment) - set(replicas))
    if missing:
        raise UsageError(f"the plan uses devices without a replica: {', '.join(missing)}")
    base = replicas[home].program
    maps = {d: AddressMap(base, r.program) for d, r in replicas.items() if d != home}
    copies = transfers(base, assignment, home)
    nodes = {d: program_nodes(r.captured) for d, r in replicas.items()}
    by_position: dict[int, list[Transfer]] = {}
    for t in copies:
        by_position.setdefault(t.before, []).append(t)

    def where(device: str, t: Transfer) -> int:
        if device == home:
            return t.address
        if t.writer is None:  # a step input: same buffer name in every capture
            buffer = next(b for b in base.buffers if b.address <= t.address < b.address + b.size_bytes)
            return maps[device].translate_input(buffer.name, t.address - buffer.address)
        return maps[device].translate([t.writer, t.reader], t.address, t.length_bytes)

    graph = driver.create_graph()
    last: dict[str, Any] = {}
    count = 0

    def after(*devices: str) -> list[Any]:
        return [last[d] for d in dict.fromkeys(devices) if d in last]

    def copy(t: Transfer) -> None:
        nonlocal count
        dst, src = where(t.dst, t), where(t.src, t)
        try:
            node = driver.add_copy(graph, after(t.src, t.dst), dst, src, t.length_bytes,
                                   replicas[t.dst].captured.context)
        except driver.DriverError as exc:
            raise driver.DriverError(f"{exc}: copy of {t.length_bytes} bytes {t.src} {src:#x} -> {t.dst} {dst:#x} "
                                     f"(written by launch {t.writer}, read by {t.reader})") from exc
        last[t.src] = last[t.dst] = node
        count += 1

    for t in by_position.get(START, []):
        copy(t)
    for i, device in enumerate(assignment):
        for t in by_position.get(i, []):
            copy(t)
        r = replicas[device].captured
        last[device] = driver.add_copy_of(graph, r.nodes[nodes[device][i]], after(device), r.context)
        count += 1
    for t in by_position.get(len(assignment), []):
        copy(t)
    return Built(graph, driver.instantiate(graph), copies, sum(t.length_bytes for t in copies), count)


def run(built: Built, stream: int) -> None:
    driver.launch(built.executable, stream)


def release(built: Built) -> None:
    driver.destroy(built.graph, built.executable)
