"""The executor's copies, checked by simulating where every byte's last writer is, on the CPU.

``plan.delivery.stale_reads`` runs a plan's graph over each device's memory as writer stamps and
compares every read, and what the step leaves at home, with a single-device run. Here the graph
(``schedule.schedule``) runs node by node in random orders its dependencies allow, as the GPU may
run it, and no order may show a launch another writer than the single-device run does.
"""

import random
from dataclasses import replace
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.delivery import stale_reads
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.transfers import START, AddressMap, transfers

pytestmark = pytest.mark.unit

HERE = Path(__file__).parents[1] / "data" / "h200-capture"


def program(step: str, kind: str = "capture"):
    return assemble(RawCapture.load(HERE / f"{step}.{kind}.json.gz"))


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
    """The reads of the plan's graph that see a wrong writer when it runs in a random order its
    dependencies allow (``seed``); ``skip``: the index of a copy to leave out (to show it is caught)."""
    order = [n for n in in_some_order(nodes, random.Random(seed)) if n.index != skip]
    assert len(order) == len(nodes) - (skip is not None), "the dependencies have a cycle"
    return stale_reads(prog, assignment, home, order)


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
    assert wrong and wrong[0].startswith(f"launch {middle.copy.reader} ")


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
