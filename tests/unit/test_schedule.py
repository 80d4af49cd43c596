"""The plan's graph (``plan/schedule.py``) on the recorded steps: race-free by ``races``, its
streams chains, and the overlapping schedule really overlapping copies with compute."""

import random
from dataclasses import replace
from pathlib import Path

import pytest

from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.schedule import races, schedule

pytestmark = pytest.mark.unit

HERE = Path(__file__).parents[1] / "data" / "h200-capture"
STEPS = sorted(p.name.removesuffix(".capture.json.gz") for p in HERE.glob("*.capture.json.gz"))


def program(step: str):
    return assemble(RawCapture.load(HERE / f"{step}.capture.json.gz"))


def plans(n: int) -> dict[str, list[str]]:
    out = {"all-A": ["A"] * n, "all-B": ["B"] * n, "halves": ["A"] * (n // 2) + ["B"] * (n - n // 2)}
    for seed in range(3):
        rng = random.Random(seed)
        out[f"random-{seed}"] = [rng.choice("AB") for _ in range(n)]
    return out


def ancestors(nodes) -> list[int]:
    """Per node, the bitset of the nodes it runs after."""
    out = []
    for n in nodes:
        bits = 0
        for d in n.deps:
            bits |= out[d] | 1 << d
        out.append(bits)
    return out


def critical_path(nodes) -> int:
    """The longest chain of dependencies, in nodes: the graph's time with every node costing one."""
    depth = []
    for n in nodes:
        depth.append(1 + max((depth[d] for d in n.deps), default=0))
    return max(depth)


def test_the_recorded_steps_are_found():
    assert {"llama-decode", "llama-prefill", "llama-decode-compiled", "moe-decode", "mamba-decode",
            "vlm-prefill", "dit-denoise", "llama8b-decode", "llama8b-prefill"} <= set(STEPS)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("overlap", [True, False])
def test_the_plan_graph_has_no_race(step, overlap):
    prog = program(step)
    n = len(prog.launches)
    for name, assignment in plans(n).items():
        nodes = schedule(prog, assignment, "A", overlap=overlap)
        assert races(prog, assignment, nodes) == [], f"{step} {name}"
        assert sum(x.launch is not None for x in nodes) == n
        assert all(x.index == k and all(d < k for d in x.deps) for k, x in enumerate(nodes)), "topological"


@pytest.mark.parametrize("overlap", [True, False])
def test_each_stream_is_a_chain(overlap):
    prog = program("llama-decode")
    assignment = plans(len(prog.launches))["random-0"]
    nodes = schedule(prog, assignment, "A", overlap=overlap)
    before = ancestors(nodes)
    last = {}
    for x in nodes:
        if x.launch is not None:
            assert x.stream == f"compute:{assignment[x.launch]}"
        else:
            assert x.stream == f"link:{x.copy.src}->{x.copy.dst}"
        if x.stream in last:
            assert before[x.index] >> last[x.stream] & 1, f"node {x.index} may pass node {last[x.stream]}"
        last[x.stream] = x.index
    assert {"compute:A", "compute:B", "link:A->B", "link:B->A"} <= set(last)


@pytest.mark.parametrize("step", ["llama-decode", "mamba-decode", "llama8b-decode"])
def test_copies_overlap_compute_on_a_halves_plan(step):
    prog = program(step)
    assignment = plans(len(prog.launches))["halves"]
    serial, overlapped = (schedule(prog, assignment, "A", overlap=o) for o in (False, True))
    assert critical_path(overlapped) < critical_path(serial)
    for nodes, overlapping in ((serial, False), (overlapped, True)):
        before = ancestors(nodes)
        # a copy and a launch on its destination that may run at the same time
        concurrent = [(c.index, x.index) for c in nodes if c.copy is not None for x in nodes
                      if x.devices == (c.copy.dst,)
                      and not (before[x.index] >> c.index & 1 or before[c.index] >> x.index & 1)]
        assert bool(concurrent) == overlapping


def test_every_overlapping_dependency_is_needed():
    """Dropping any one dependency of the overlapping graph, other than a stream's order, leaves its
    two conflicting nodes unordered, and ``races`` names them: the schedule has nothing to spare, and
    ``races`` catches a broken one whichever rule it breaks."""
    prog = program("llama-decode")
    assignment = plans(len(prog.launches))["random-1"]
    nodes = schedule(prog, assignment, "A")
    previous = {}
    kinds = set()
    for x in nodes:
        for d in x.deps:
            broken = list(nodes)
            broken[x.index] = replace(x, deps=tuple(e for e in x.deps if e != d))
            if any(line.startswith(f"node {x.index} ") and f"and node {d} " in line
                   for line in races(prog, assignment, broken)):
                kinds.add(_kind(nodes[d], x))
            else:
                assert d == previous[x.stream], f"node {x.index} needs no node {d}"
        previous[x.stream] = x.index
    assert kinds >= {"copy after its writer", "reader after its copy", "copy after uses of its destination",
                     "overwrite of a copy's source after the copy"}


def _kind(y, x) -> str:
    """Which rule of the module docstring orders node y before node x."""
    if y.stream == x.stream:
        return "stream order"
    if x.copy is not None and y.launch is not None:
        return "copy after its writer" if y.launch == x.copy.writer else "copy after uses of its destination"
    if x.launch is not None and y.copy is not None:
        if x.launch == y.copy.reader:
            return "reader after its copy"
        if x.devices == (y.copy.src,):
            return "overwrite of a copy's source after the copy"
        return "launch after a copy"
    return "copy after a copy"


def test_a_missing_dependency_is_a_race():
    prog = program("llama-decode")
    rng = random.Random(3)
    assignment = [rng.choice("AB") for _ in prog.launches]
    nodes = schedule(prog, assignment, "A", overlap=False)
    # cut the dependencies of the first launch that reads bytes a copy brought to its device
    copied = next(x for x in nodes if x.copy is not None and x.copy.reader is not None)
    victim = next(x for x in nodes if x.launch == copied.copy.reader)
    broken = [replace(x, deps=()) if x is victim else x for x in nodes]
    found = races(prog, assignment, broken)
    assert found and any(f"node {victim.index} " in line for line in found)
