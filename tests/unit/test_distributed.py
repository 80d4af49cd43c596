"""Each rank's part of a plan (``runtime/distributed.py: rank_ops``) on the recorded steps:
every launch runs once, every copy is one send and one matching receive, and all ranks together
finish without a deadlock and in dependency order (simulated here, rank by rank)."""

import random
from collections import defaultdict
from pathlib import Path

import pytest

from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.slots import pipeline
from kernelfleet.runtime.distributed import local, rank_ops, weights_read
from kernelfleet.runtime.executor import Places, plan_graph

pytestmark = pytest.mark.unit

HERE = Path(__file__).parents[1] / "data" / "h200-capture"
STEPS = ["llama-decode", "moe-decode", "mamba-decode", "llama8b-prefill"]
DEVICES = ["A", "B", "C", "D", "E", "F", "G", "H"]


def combined(step: str, plan: str, slots: int, mode: str, devices: int = 2):
    program = assemble(RawCapture.load(HERE / f"{step}.capture.json.gz"))
    n = len(program.launches)
    names = DEVICES[:devices]
    if plan == "halves":
        assignment = [names[i * devices // n] for i in range(n)]
    else:
        rng = random.Random(plan)
        assignment = [rng.choice(names) for _ in range(n)]
    orders = [schedule(program, assignment, names[k % devices], True, True) for k in range(slots)]
    return pipeline(orders, mode), names


def simulate(graph, names):
    """Run every rank's ops as the GPUs may: an op starts once it heads its stream, its waits have
    ended, and, for a copy, its partner on the other rank is also ready (NCCL's rendezvous; a rank's
    copies share one stream). Returns each combined node's end step; fails on a deadlock."""
    ops = {d: rank_ops(graph, d) for d in names}
    done = {d: [None] * len(ops[d]) for d in names}
    pending = {d: defaultdict(list) for d in names}  # stream -> op indices, in order
    for d in names:
        for i, op in enumerate(ops[d]):
            pending[d][op.stream].append(i)
    ended: dict[int, int] = {}
    clock = 0  # counts op ends: an op sees the ends counted before it

    def ready(d, i):
        op = ops[d][i]
        return pending[d][op.stream][0] == i and all(done[d][w] is not None for w in op.waits)

    while any(q for d in names for q in pending[d].values()):
        progressed = False
        for d in names:
            for stream, queue in list(pending[d].items()):
                if not queue or not ready(d, queue[0]):
                    continue
                i = queue[0]
                op = ops[d][i]
                clock += 1
                if op.kind == "segment":
                    queue.pop(0)
                    done[d][i] = clock
                    ended.update((k, clock) for k in op.items)
                    progressed = True
                    continue
                peer = pending[op.peer]["copy"]
                if not peer or ops[op.peer][peer[0]].items != op.items or not ready(op.peer, peer[0]):
                    continue
                j = peer.pop(0)
                queue.pop(0)
                done[d][i] = done[op.peer][j] = clock
                ended[op.items[0]] = clock
                progressed = True
        assert progressed, f"deadlock at step {clock}"
    return ended, ops


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("plan,slots,mode,devices", [("halves", 1, "sequential", 2), ("random-0", 1, "sequential", 2),
                                                    ("random-1", 3, "sequential", 2), ("random-2", 3, "free", 2),
                                                    ("random-3", 2, "free", 3), ("halves", 3, "sequential", 3),
                                                    ("random-4", 2, "sequential", 4), ("random-6", 2, "free", 8)])
def test_every_rank_together_runs_the_plan_in_dependency_order(step, plan, slots, mode, devices):
    graph, names = combined(step, plan, slots, mode, devices)
    ended, ops = simulate(graph, names)
    assert sorted(ended) == list(range(len(graph)))  # every node ran
    segment_of = {k: (d, i) for d in names for i, op in enumerate(ops[d]) if op.kind == "segment" for k in op.items}
    for k, x in enumerate(graph):
        for dep in x.deps:
            if segment_of.get(k) is not None and segment_of.get(k) == segment_of.get(dep):
                assert dep < k  # inside one CUDA graph the edge orders them
            else:
                assert ended[dep] < ended[k], f"node {k} ended at {ended[k]}, before its dependency {dep}"


@pytest.mark.parametrize("step", STEPS)
def test_each_launch_runs_once_and_each_copy_is_one_send_and_one_matching_receive(step):
    graph, names = combined(step, "random-5", 2, "sequential")
    ops = {d: rank_ops(graph, d) for d in names}
    launches = sorted(k for d in names for op in ops[d] if op.kind == "segment" for k in op.items)
    assert launches == [k for k, x in enumerate(graph) if x.node.launch is not None]
    copies = [k for k, x in enumerate(graph) if x.node.copy is not None]
    assert copies, "a random plan over two devices copies something"
    for src in names:
        for dst in names:
            sent = [op.items[0] for op in ops[src] if op.kind == "send" and op.peer == dst]
            received = [op.items[0] for op in ops[dst] if op.kind == "recv" and op.peer == src]
            assert sent == received  # the k-th send of a pair is the k-th receive: NCCL matches them so
            assert sent == [k for k in copies if graph[k].node.copy.src == src and graph[k].node.copy.dst == dst]
    for d in names:
        for i, op in enumerate(ops[d]):
            assert all(w < i and ops[d][w].stream != op.stream for w in op.waits)
            assert all(local(graph[k].node, d) for k in op.items)
            if op.kind == "segment":
                assert len({graph[k].slot for k in op.items}) == 1


def test_a_plan_on_one_device_is_one_segment_per_slot_and_the_other_rank_idles():
    graph, _ = combined("llama-decode", "halves", 2, "sequential", 1)
    assert [op.kind for op in rank_ops(graph, "A")] == ["segment", "segment"]
    assert rank_ops(graph, "B") == []


def test_each_rank_finds_every_copied_byte_range_in_its_own_capture():
    """The two captures of the 8B decode step recorded on two H200s: at a cut through the middle,
    the sender finds each copy's bytes in its capture and the receiver in its own, the same length."""
    pair = Path(__file__).parents[1] / "data" / "h200x2-disagg"
    programs = {d: assemble(RawCapture.load(pair / f"llama8b-decode.{d}.capture.json.gz"))
                for d in ("compute", "bandwidth")}
    n = len(programs["compute"].launches)
    assignment = ["compute"] * (n // 2) + ["bandwidth"] * (n - n // 2)
    homes = ("compute", "bandwidth")
    _, graph = plan_graph([(programs[home], assignment, home) for home in homes], resident_state=True)
    places = [Places(home, programs) for home in homes]
    for device in programs:
        buffers = {b.id: b for b in programs[device].buffers}
        for op in rank_ops(graph, device):
            if op.kind == "segment":
                continue
            t = graph[op.items[0]].node.copy
            at = places[op.slot].where(device, t, [t.writer, t.reader] if op.kind == "send" else [t.reader, t.writer])
            assert any(b.address <= at and at + t.length_bytes <= b.address + b.size_bytes for b in buffers.values())
    assert sum(op.kind == "send" for d in programs for op in rank_ops(graph, d)) >= 4  # inputs, the cut, outputs


def test_a_device_holds_only_the_weights_its_launches_read():
    """On the 8B decode capture cut in two, each half reads about half the weight bytes, every
    weight some launch reads is held by one side or the other, and one device alone holds them all."""
    program = assemble(RawCapture.load(HERE / "llama8b-decode.capture.json.gz"))
    n = len(program.launches)
    weights = [b for b in program.buffers if b.role == "weight"]
    total = sum(b.size_bytes for b in weights)
    halves = ["A"] * (n // 2) + ["B"] * (n - n // 2)
    held = {d: weights_read(program, halves, d) for d in "AB"}
    size = {d: sum(e - s for s, e in spans) for d, spans in held.items()}
    assert all(0.3 * total < size[d] < 0.7 * total for d in "AB")
    for b in weights:
        read = any(a.buffer == b.id for launch in program.launches for a in launch.accesses)
        inside = any(s <= b.address and b.address + b.size_bytes <= e for d in "AB" for s, e in held[d])
        assert inside == read
    alone = weights_read(program, ["A"] * n, "A")
    assert sum(e - s for s, e in alone) >= size["A"] + size["B"] - sum(  # shared ones (embeddings) counted once
        min(e1, e2) - max(s1, s2) for s1, e1 in held["A"] for s2, e2 in held["B"] if max(s1, s2) < min(e1, e2))
    assert weights_read(program, ["A"] * n, "B") == []
    assert all(s < e <= s2 for (s, e), (s2, _) in zip(alone, alone[1:]))  # merged and sorted
