"""A plan carried from the server's decode step at the whole context to the same step attending 128
positions (graph/units.carried, as serve/placed_build.py carries every plan to its context buckets),
on what an H100 recorded (tests/data/h100-serve-contexts, ``python -m bench.record_serve_contexts``:
a 2-layer Llama with the 8B's attention shape, batch 8 of 8 slots of 2,048 tokens; 2026-12-07).

Here both captures launch the same 111 kernels, but four of their 103 ops touch tensors of other
extents (the mask's ``arange`` and ``le``, and each layer's attention over 128 positions instead of
2,048): matched by op and extents, as the devices' captures are, those would not pair one to one;
matched by name they do. Checked on the CPU: the plan comes back launch for launch, every op's
launches where that op's ran, it passes the validator and keeps the KV cache where it was, and the
executor builds its graph over the shorter capture through the null driver."""

from pathlib import Path

import pytest

from kernelfleet.graph.units import carried, op_key
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.kernels.raw import RawCapture, program_nodes
from kernelfleet.plan.model import Device, Plan
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.executor import Replica, Slot, build
from kernelfleet.serve.placed_plans import kv_devices

pytestmark = pytest.mark.replay

DATA = Path(__file__).parents[1] / "data" / "h100-serve-contexts"


@pytest.fixture(scope="module")
def raws() -> dict[str, RawCapture]:
    return {name: RawCapture.load(DATA / f"{name}.capture.json.gz") for name in ("whole", "c128")}


def layer_1_on_b(raw: RawCapture) -> list[str]:
    """Layer 1 on b, from the first launch that touches its cache or weights to the last; the rest on
    a (home)."""
    program = assemble(raw)
    named = {b.id for b in program.buffers if b.name and (b.name.startswith("cache_1_")
                                                         or b.name.startswith("model.model.layers.1."))}
    touching = [launch.index for launch in program.launches if any(a.buffer in named for a in launch.accesses)]
    return ["b" if touching[0] <= k <= touching[-1] else "a" for k in range(len(program.launches))]


def chains(raw: RawCapture) -> list[list[int]]:
    return [[n] for n in program_nodes(raw)]


def test_the_shorter_capture_launches_the_same_kernels_but_four_ops_touch_other_extents(raws):
    whole, short = raws["whole"], raws["c128"]
    assert [whole.nodes[n].name for n in program_nodes(whole)] == [short.nodes[n].name for n in program_nodes(short)]
    assert len(program_nodes(whole)) == 111 and len(whole.ops) == len(short.ops) == 103
    assert [a.name for a in whole.ops] == [b.name for b in short.ops]
    assert sorted(a.name for a, b in zip(whole.ops, short.ops) if op_key(a) != op_key(b)) == [
        "aten.arange.default", "aten.le.Tensor", *["aten.scaled_dot_product_attention.default"] * 2]


def test_a_plan_carried_to_the_shorter_capture_places_every_op_where_it_ran(raws):
    whole, short = raws["whole"], raws["c128"]
    plan = layer_1_on_b(whole)
    assert 0 < plan.count("b") < len(plan)
    got = carried(plan, chains(whole), whole, chains(short), short)
    assert got == plan  # the same kernels, launch for launch
    device_of = dict(zip(program_nodes(whole), plan))
    there = dict(zip(program_nodes(short), got))
    for a, b in zip(whole.ops, short.ops):
        mine = {device_of[n] for n in range(a.first, a.end) if n in device_of}
        assert {there[n] for n in range(b.first, b.end) if n in there} == mine
    # as the server checks it: valid on the shorter capture, the caches where the plan made for the whole put them
    program = assemble(short)
    runtime_plans.checked(runtime_plans.problem(program, [Device("a"), Device("b")]), Plan("carried", got, 0.0),
                          "carried")
    assert kv_devices(program, got, "c128") == kv_devices(assemble(whole), plan, "whole") == {
        "cache_0_keys": "a", "cache_0_values": "a", "cache_1_keys": "b", "cache_1_values": "b"}


def test_the_carried_plans_graph_builds_over_the_shorter_capture(raws):
    short = raws["c128"]
    program = assemble(short)
    got = carried(layer_1_on_b(raws["whole"]), chains(raws["whole"]), raws["whole"], chains(short), short)
    null = NullDriver()
    replicas = {d: Replica(Captured(short, None, None, [(d, i) for i in range(len(short.nodes))], (), None,
                                    context=d), program) for d in ("a", "b")}
    built = build([Slot(replicas, got, "a")], resident_state=True, driver=null)
    launches = [x for x in null.added if x.kind == "launch"]
    assert len(launches) == len(program.launches)
    assert [x.ctx for x in launches] == got  # each launch in the context of the device the carried plan gives it
    assert built.executable in null.live
