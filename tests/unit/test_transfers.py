"""The executor's copies, checked by simulating where every byte's last writer is, on the CPU.

For a plan, each device's memory is tracked as (start, end, writer) segments per buffer: a launch
stamps its writes on its own device, a copy carries the stamps of its range from one device to
another. Every read must then see, on its device, exactly the writers a single-device run would
show it — and home must end with every output and state byte as a single-device run leaves it.
"""

import random
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import _overwrite, flows
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.runtime.schedule import Node, races, schedule
from kernelfleet.runtime.transfers import START, AddressMap, transfers

pytestmark = pytest.mark.unit

HERE = Path(__file__).parents[1] / "data" / "h200-capture"


def program(step: str, kind: str = "capture"):
    return assemble(RawCapture.load(HERE / f"{step}.{kind}.json.gz"))


def segments_in(memory, buffer, start, end):
    return [(max(s, start), min(e, end), w) for s, e, w in memory.get(buffer, []) if min(e, end) > max(s, start)]


def simulate(prog, assignment, home, drop=None):
    """Replay the plan over writer stamps; return the reads that would see a wrong writer.
    ``drop``: the index of a copy to leave out (to show the simulation catches it)."""
    buffers = {b.id: b for b in prog.buffers}
    devices = {d: {} for d in set(assignment) | {home}}
    copies = transfers(prog, assignment, home)
    if drop is not None:
        copies = copies[:drop] + copies[drop + 1:]
    at = {}
    for t in copies:
        at.setdefault(t.before, []).append(t)

    def apply(t):
        b, off = t.buffer, t.offset_bytes
        for s, e, w in segments_in(devices[t.src], b, off, off + t.length_bytes):
            devices[t.dst][b] = _overwrite(devices[t.dst].get(b, []), s, e, w)

    wrong = []
    truth = {}
    for f in flows(prog)[0]:
        truth.setdefault(f.dst, []).append((f.buffer, f.start, f.end, f.src))
    for t in at.get(START, []):
        apply(t)
    for launch in prog.launches:
        for t in at.get(launch.index, []):
            apply(t)
        mine = devices[assignment[launch.index]]
        for b, s, e, w in truth.get(launch.index, []):
            seen = segments_in(mine, b, s, e)
            if {x[2] for x in seen} != {w} or sum(x[1] - x[0] for x in seen) != e - s:
                wrong.append((launch.index, b, s, e, w, seen))
        for a in launch.accesses:
            if a.writes:
                mine[a.buffer] = _overwrite(mine.get(a.buffer, []), a.offset_bytes, a.end, launch.index)
    for t in at.get(len(prog.launches), []):
        apply(t)
    final = flows(prog)[1]
    for b, segs in final.items():
        if buffers[b].role == "output" or (buffers[b].name and buffers[b].role != "weight"):
            for s, e, w in segs:
                if {x[2] for x in segments_in(devices[home], b, s, e)} != {w}:
                    wrong.append(("final", b, s, e, w))
    return wrong, copies


@pytest.mark.parametrize("step", ["llama-decode", "mamba-decode", "moe-decode", "llama8b-decode"])
def test_every_read_sees_its_single_device_writer(step):
    prog = program(step)
    n = len(prog.launches)
    plans = {"all-home": ["A"] * n, "all-other": ["B"] * n, "halves": ["A"] * (n // 2) + ["B"] * (n - n // 2)}
    for seed in range(3):
        rng = random.Random(seed)
        plans[f"random-{seed}"] = [rng.choice("AB") for _ in range(n)]
    for name, assignment in plans.items():
        wrong, copies = simulate(prog, assignment, "A")
        assert wrong == [], f"{step} {name}: {wrong[:3]}"
        if name == "all-home":
            assert copies == []
        if name == "all-other":
            assert {t.before for t in copies} <= {START, n}  # inputs out, outputs and state home


def test_a_missing_copy_is_caught_by_the_simulation():
    prog = program("llama-decode")
    rng = random.Random(0)
    assignment = [rng.choice("AB") for _ in prog.launches]
    _, copies = simulate(prog, assignment, "A")
    middle = next(i for i, t in enumerate(copies) if t.writer is not None and t.reader is not None)
    wrong, _ = simulate(prog, assignment, "A", drop=middle)
    assert wrong and wrong[0][0] == copies[middle].reader


def test_addresses_translate_between_two_captures_of_a_step():
    home, other = program("llama8b-decode"), program("llama8b-decode", "profiled-capture")
    amap = AddressMap(home, other)
    rng = random.Random(1)
    assignment = [rng.choice("AB") for _ in home.launches]
    for t in transfers(home, assignment, "A"):
        if t.writer is not None:
            here = next(b.address for b in home.buffers if b.id == t.buffer) + t.offset_bytes
            there = amap.translate([t.writer, t.reader], here, t.length_bytes)
            assert any(b.address <= there and there + t.length_bytes <= b.address + b.size_bytes for b in other.buffers)
    with pytest.raises(UsageError, match="different kernels"):
        AddressMap(home, program("llama-decode"))


def test_plan_length_must_match():
    prog = program("llama-decode")
    with pytest.raises(UsageError, match="places 3 launches"):
        transfers(prog, ["A"] * 3, "A")


@pytest.mark.parametrize("step", ["llama-decode", "mamba-decode", "llama8b-decode"])
def test_the_plan_graph_has_no_race(step):
    prog = program(step)
    n = len(prog.launches)
    rng = random.Random(7)
    for assignment in (["A"] * n, ["B"] * n, ["A"] * (n // 2) + ["B"] * (n - n // 2),
                       [rng.choice("AB") for _ in range(n)]):
        nodes = schedule(prog, assignment, "A")
        assert races(prog, assignment, nodes) == []
        assert sum(x.launch is not None for x in nodes) == n


def test_a_missing_dependency_is_a_race():
    prog = program("llama-decode")
    rng = random.Random(3)
    assignment = [rng.choice("AB") for _ in prog.launches]
    nodes = schedule(prog, assignment, "A")
    # cut the dependencies of the first launch that reads bytes a copy brought to its device
    copied = next(x for x in nodes if x.copy is not None and x.copy.reader is not None)
    victim = next(x for x in nodes if x.launch == copied.copy.reader)
    broken = [Node(x.index, x.launch, x.copy, x.devices, () if x is victim else x.deps) for x in nodes]
    found = races(prog, assignment, broken)
    assert found and any(f"node {victim.index} " in line for line in found)
