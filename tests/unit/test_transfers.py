"""The executor's copies, checked by simulating where every byte's last writer is, on the CPU.

For a plan, each device's memory is tracked as (start, end, writer) segments per buffer: a launch
stamps its writes on its own device, a copy carries the stamps of its range from one device to
another. The plan's graph (``schedule.schedule``) runs node by node in random orders its
dependencies allow, as the GPU may run it. Every read must then see, on its device, exactly the
writers a single-device run would show it — and home must end with every output and state byte as
a single-device run leaves it.
"""

import random
from dataclasses import replace
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import _overwrite, flows
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.transfers import START, AddressMap, transfers

pytestmark = pytest.mark.unit

HERE = Path(__file__).parents[1] / "data" / "h200-capture"


def program(step: str, kind: str = "capture"):
    return assemble(RawCapture.load(HERE / f"{step}.{kind}.json.gz"))


def segments_in(memory, buffer, start, end):
    return [(max(s, start), min(e, end), w) for s, e, w in memory.get(buffer, []) if min(e, end) > max(s, start)]


def in_some_order(nodes, rng):
    """The nodes in an order their dependencies allow, each time picking at random among the ready ones."""
    waiting = [len(n.deps) for n in nodes]
    after = [[] for _ in nodes]
    for n in nodes:
        for d in n.deps:
            after[d].append(n.index)
    ready = [n.index for n in nodes if not n.deps]
    while ready:
        k = ready.pop(rng.randrange(len(ready)))
        yield nodes[k]
        for m in after[k]:
            waiting[m] -= 1
            if waiting[m] == 0:
                ready.append(m)


def simulate(prog, assignment, home, nodes, seed, skip=None):
    """Run the plan's graph over writer stamps, in a random order its dependencies allow (``seed``);
    return the reads that would see a wrong writer. ``skip``: the index of a copy to leave out (to
    show the simulation catches it)."""
    buffers = {b.id: b for b in prog.buffers}
    devices = {d: {} for d in set(assignment) | {home}}
    truth = {}

    def key(launch, buffer, scratch):  # an op call's workspace stamps are its own (graph.deps.flows)
        return ("scratch", prog.launches[launch].op_index, buffer) if scratch else buffer

    for f in flows(prog)[0]:
        truth.setdefault(f.dst, []).append((key(f.dst, f.buffer, f.scratch), f.start, f.end, f.src))

    def carry(t):  # a copy moves the bytes, whichever record (the step's, or its writer's call's) stamps them
        off = t.offset_bytes
        for b in {t.buffer} | ({key(t.writer, t.buffer, True)} if t.writer is not None else set()):
            for s, e, w in segments_in(devices[t.src], b, off, off + t.length_bytes):
                devices[t.dst][b] = _overwrite(devices[t.dst].get(b, []), s, e, w)

    wrong = []
    ran = 0
    for n in in_some_order(nodes, random.Random(seed)):
        ran += 1
        if n.copy is not None:
            if n.index != skip:
                carry(n.copy)
            continue
        launch = prog.launches[n.launch]
        mine = devices[assignment[launch.index]]
        for b, s, e, w in truth.get(launch.index, []):
            seen = segments_in(mine, b, s, e)
            if {x[2] for x in seen} != {w} or sum(x[1] - x[0] for x in seen) != e - s:
                wrong.append((launch.index, b, s, e, w, seen))
        for a in launch.accesses:
            if a.writes:
                k = key(launch.index, a.buffer, a.source == "conservative" and launch.op_index is not None)
                mine[k] = _overwrite(mine.get(k, []), a.offset_bytes, a.end, launch.index)
    assert ran == len(nodes), "the dependencies have a cycle"
    final = flows(prog)[1]
    for b, segs in final.items():
        if buffers[b].role == "output" or (buffers[b].name and buffers[b].role != "weight"):
            for s, e, w in segs:
                if {x[2] for x in segments_in(devices[home], b, s, e)} != {w}:
                    wrong.append(("final", b, s, e, w))
    return wrong


@pytest.mark.parametrize("step", ["llama-decode", "mamba-decode", "moe-decode", "llama8b-decode"])
@pytest.mark.parametrize("overlap", [True, False])
def test_every_read_sees_its_single_device_writer(step, overlap):
    prog = program(step)
    n = len(prog.launches)
    plans = {"all-home": ["A"] * n, "all-other": ["B"] * n, "halves": ["A"] * (n // 2) + ["B"] * (n - n // 2)}
    for seed in range(3):
        rng = random.Random(seed)
        plans[f"random-{seed}"] = [rng.choice("AB") for _ in range(n)]
    for name, assignment in plans.items():
        nodes = schedule(prog, assignment, "A", overlap=overlap)
        for seed in range(3):
            wrong = simulate(prog, assignment, "A", nodes, seed)
            assert wrong == [], f"{step} {name} seed {seed}: {wrong[:3]}"
        copies = [x.copy for x in nodes if x.copy is not None]
        if name == "all-home":
            assert copies == []
        if name == "all-other":
            assert {t.before for t in copies} <= {START, n}  # inputs out, outputs and state home


def test_a_missing_copy_is_caught_by_the_simulation():
    prog = program("llama-decode")
    rng = random.Random(0)
    assignment = [rng.choice("AB") for _ in prog.launches]
    nodes = schedule(prog, assignment, "A")
    middle = next(x for x in nodes if x.copy is not None and None not in (x.copy.writer, x.copy.reader))
    wrong = simulate(prog, assignment, "A", nodes, seed=0, skip=middle.index)
    assert wrong and wrong[0][0] == middle.copy.reader


def exact_cover(launch, buffer, start, end) -> bool:
    return any(a.buffer == buffer and a.offset_bytes <= start and end <= a.end and a.source != "conservative"
               for a in launch.accesses)


def test_addresses_translate_between_two_captures_of_a_step():
    """Bytes both ends of a flow address exactly are placed, alike by the writer and the reader.
    A range only a pointer-like word reaches is placed only where both captures point alike, else
    the plan is refused with a clear error; since such words (often stale values in a struct's
    unused slots) no longer carry data between op calls (graph.deps.flows), none is refused here."""
    home, other = program("llama8b-decode"), program("llama8b-decode", "profiled-capture")
    amap = AddressMap(home, other)
    rng = random.Random(1)
    assignment = [rng.choice("AB") for _ in home.launches]
    placed = refused = 0
    for t in transfers(home, assignment, "A"):
        if t.writer is None or t.reader is None:
            continue
        here = next(b.address for b in home.buffers if b.id == t.buffer) + t.offset_bytes
        end = t.offset_bytes + t.length_bytes
        exact = all(exact_cover(home.launches[x], t.buffer, t.offset_bytes, end) for x in (t.writer, t.reader))
        try:
            there = amap.translate([t.writer, t.reader], here, t.length_bytes)
        except UsageError as exc:
            assert not exact, f"an exactly known flow was refused: {exc}"
            assert "pin them together" in str(exc)
            refused += 1
            continue
        assert amap.translate([t.reader, t.writer], here, t.length_bytes) == there
        assert any(b.address <= there and there + t.length_bytes <= b.address + b.size_bytes for b in other.buffers)
        placed += 1
    assert placed > 100 and refused == 0
    with pytest.raises(UsageError, match="different kernels"):
        AddressMap(home, program("llama-decode"))


def test_plan_length_must_match():
    prog = program("llama-decode")
    with pytest.raises(UsageError, match="places 3 launches"):
        transfers(prog, ["A"] * 3, "A")


def test_a_missing_dependency_is_caught_by_the_simulation():
    """Run in random orders, the simulation sees a reader that no longer waits for its copy."""
    prog = program("llama-decode")
    rng = random.Random(0)
    assignment = [rng.choice("AB") for _ in prog.launches]
    nodes = schedule(prog, assignment, "A")
    launch_node = {x.launch: x for x in nodes if x.launch is not None}
    copied, reader = next((x, launch_node[x.copy.reader]) for x in nodes
                          if x.copy is not None and None not in (x.copy.writer, x.copy.reader)
                          and x.index in launch_node[x.copy.reader].deps)
    broken = list(nodes)
    broken[reader.index] = replace(reader, deps=tuple(d for d in reader.deps if d != copied.index))
    assert any(simulate(prog, assignment, "A", broken, seed) for seed in range(3))
