"""The executor's control flow on the CPU: runtime/executor.py builds its graph through a
recording twin of the driver doorway, over the two captures two H200s made of the 8B decode step
(tests/data/h200x2-disagg). Checked: every launch becomes a copy of its own replica's node, every
copy moves bytes between the right captures' buffers, and the graph's dependencies are exactly
plan/slots.py's, across slots too."""

from contextlib import nullcontext
from pathlib import Path

import pytest

from kernelfleet.kernels.cuda import driver
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.errors import UsageError
from kernelfleet.runtime.executor import Replica, Slot, build, run
from kernelfleet.runtime.link import Throttle
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.slots import pipeline

pytestmark = pytest.mark.replay

RUNS = Path(__file__).parents[1] / "data" / "h200x2-disagg"
DEVICES = ("compute", "bandwidth")


class Twin:
    """Records the graph the executor builds: node i is ("launch"|"copy"|"wait", what, after)."""

    def __init__(self, monkeypatch) -> None:
        self.nodes: list[tuple] = []
        for name, fn in {
            "create_graph": lambda: "graph",
            "add_copy_of": lambda graph, node, after, ctx: self.add("launch", (ctx, node), after),
            "add_copy": lambda graph, after, dst, src, length, ctx: self.add("copy", (dst, src, length), after),
            "add_kernel": lambda graph, after, function, grid, block, params, ctx: self.add("kernel", function, after),
            "load_module": lambda ptx, entries, ctx: ("module", {e: e for e in entries}),
            "unload_module": lambda module: None,
            "in_context": lambda ctx: nullcontext(),
            "node_kind": lambda node: "kernel",
            "instantiate": lambda graph: "executable",
            "priority_range": lambda: (0, -5),
            "set_priority": lambda node, priority: None,
        }.items():
            monkeypatch.setattr(driver, name, fn)

    def add(self, kind: str, what, after: list[int]) -> int:
        self.nodes.append((kind, what, tuple(after)))
        return len(self.nodes) - 1


def replicas(slot: int = 0) -> dict[str, Replica]:
    out = {}
    for device in DEVICES:
        raw = RawCapture.load(RUNS / f"llama8b-decode.{device}.capture.json.gz")
        nodes = [(device, slot, i) for i in range(len(raw.nodes))]
        captured = Captured(raw, None, None, nodes, (), None, context=f"{device}-{slot}")
        out[device] = Replica(captured, assemble(raw))
    return out


def inside(program, address: int, length: int) -> bool:
    return any(b.address <= address and address + length <= b.address + b.size_bytes for b in program.buffers)


def test_a_plan_becomes_its_replicas_nodes_and_copies_between_their_buffers(monkeypatch):
    twin = Twin(monkeypatch)
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    assignment = ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2)
    built = build([Slot(mine, assignment, "bandwidth")], resident_state=True)
    launches = [x for x in twin.nodes if x[0] == "launch"]
    assert len(launches) == n and built.nodes == n + len(built.copies) and built.method == "memcpy"
    for k, (_, (ctx, node), _) in enumerate(launches):
        assert ctx == f"{assignment[k]}-0" and node[0] == assignment[k]  # its own device's captured node
    copies = [x for x in twin.nodes if x[0] == "copy"]
    assert len(copies) == len(built.copies) > 0
    for (_, (dst, src, length), _), t in zip(copies, built.copies):
        assert inside(mine[t.dst].program, dst, length) and inside(mine[t.src].program, src, length)


@pytest.mark.parametrize("mode", ["sequential", "free"])
def test_the_graph_has_exactly_the_dependencies_slots_lays_out(monkeypatch, mode):
    twin = Twin(monkeypatch)
    slots = [replicas(k) for k in range(2)]
    n = len(slots[0]["bandwidth"].program.launches)
    assignment = ["bandwidth" if i % 7 else "compute" for i in range(n)]
    build([Slot(r, assignment, "bandwidth") for r in slots], resident_state=True, slot_mode=mode)
    orders = [schedule(r["bandwidth"].program, assignment, "bandwidth", resident_state=True) for r in slots]
    combined = pipeline(orders, mode)
    assert len(twin.nodes) == len(combined)
    assert [tuple(x[2]) for x in twin.nodes] == [x.deps for x in combined]


def test_a_paced_link_adds_a_wait_beside_each_copy(monkeypatch):
    twin = Twin(monkeypatch)
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    built = build([Slot(mine, ["bandwidth"] * (n - 3) + ["compute"] * 3, "bandwidth")],
                  throttle=Throttle(25e9 / 8), resident_state=True)
    waits = [x for x in twin.nodes if x[0] == "kernel"]
    copies = [x for x in twin.nodes if x[0] == "copy"]
    assert [w[1] for w in waits] == ["kf_wait"] * len(built.copies)
    assert [w[2] for w in waits] == [c[2] for c in copies]  # each wait starts with its copy


def test_a_racy_plan_graph_is_refused_before_the_driver_sees_it(monkeypatch):
    from dataclasses import replace

    from kernelfleet.runtime import executor

    twin = Twin(monkeypatch)
    real = executor.schedule

    def broken(*args, **kwargs):  # the first copy forgets what it waits for
        order = real(*args, **kwargs)
        k = next(i for i, n in enumerate(order) if n.copy is not None and n.deps)
        return order[:k] + [replace(order[k], deps=())] + order[k + 1:]

    monkeypatch.setattr(executor, "schedule", broken)
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    with pytest.raises(UsageError, match="races in the plan graph"):
        build([Slot(mine, ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2), "bandwidth")], resident_state=True)
    assert twin.nodes == []


def test_the_executor_refuses_the_legacy_default_stream():
    # handle 0 is the stream of whichever context is current: a graph launched there was once timed
    # by events on another device (bench disagg read 0.02 ms for an 8B decode step)
    with pytest.raises(UsageError, match="stream of its own"):
        run(None, 0)
