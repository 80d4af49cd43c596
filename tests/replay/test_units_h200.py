"""Units of placement across two captures with different kernels, on what an H200 recorded
(tests/data/h200-variants: a transformers Llama prefill with SDPA's cuDNN attention, and with its
math composition). Checked on the CPU: the op matching, the unit programs' flows against the
launch-level ones, the address translation of every copy, and the executor's graph through the
null driver."""

from collections import defaultdict
from pathlib import Path

import pytest
from recorded import misplaced_copies

from kernelfleet.graph.deps import flows
from kernelfleet.graph.units import align, differing_units, views
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.kernels.ir import merged_ranges
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.runtime.executor import Replica, Slot, build

pytestmark = pytest.mark.replay

DATA = Path(__file__).parents[1] / "data" / "h200-variants"
DEVICES = ("default", "math")


@pytest.fixture(scope="module")
def raws() -> dict[str, RawCapture]:
    return {d: RawCapture.load(DATA / f"{d}.capture.json.gz") for d in DEVICES}


@pytest.fixture(scope="module")
def unit_views(raws):
    return views(raws, {d: assemble(r) for d, r in raws.items()}, "default")


def attention_units(unit_views) -> list[int]:
    return [u for u, (a, b) in enumerate(unit_views["math"].ops) if b - a > 1]


def test_each_attention_is_one_unit_and_every_other_op_a_unit_of_its_own(raws, unit_views):
    ranges = align(raws, "default")
    assert len(ranges["default"]) == len(ranges["math"]) == len(raws["default"].ops) == 126
    assert all(b - a == 1 for a, b in ranges["default"])
    long = attention_units(unit_views)
    assert len(long) == 2  # one per layer
    for u in long:
        a, b = ranges["math"][u]
        assert b - a == 13 and raws["default"].ops[ranges["default"][u][0]].name == \
            "aten._scaled_dot_product_cudnn_attention.default"
    # every launch in exactly one unit, in capture order, on both devices
    for d in DEVICES:
        flat = [i for unit in unit_views[d].launches for i in unit]
        assert flat == list(range(len(assemble(raws[d]).launches)))
    # by position 66 ops differ in kernels (variants.json); lined up by op, only the two attentions do
    assert differing_units(unit_views, "default") == set(attention_units(unit_views))


@pytest.mark.parametrize("device", DEVICES)
def test_a_unit_program_has_exactly_the_launch_level_flows_between_its_units(raws, unit_views, device):
    program = assemble(raws[device])
    unit_of = {i: u for u, members in enumerate(unit_views[device].launches) for i in members}
    between = defaultdict(list)
    for f in flows(program)[0]:
        if unit_of[f.src] != unit_of[f.dst]:
            between[unit_of[f.src], unit_of[f.dst], f.buffer].append((f.start, f.end))
    found = defaultdict(list)
    for f in flows(unit_views[device].program)[0]:
        found[f.src, f.dst, f.buffer].append((f.start, f.end))
    assert len(between) > 100
    assert {k: merged_ranges(v) for k, v in found.items()} == {k: merged_ranges(v) for k, v in between.items()}


def plans(unit_views) -> dict[str, list[str]]:
    n = len(unit_views["default"].ops)
    attention = set(attention_units(unit_views))
    return {"halves": ["default"] * (n // 2) + ["math"] * (n - n // 2),
            "every third": ["math" if u % 3 == 0 else "default" for u in range(n)],
            "attention on math": ["math" if u in attention else "default" for u in range(n)]}


def test_every_copy_lands_in_the_bytes_its_unit_touches_in_the_other_capture(unit_views):
    """A copy's bytes, translated into the math capture, lie inside what its reader reads there (for
    the destination) or what its writer writes there (for the source): the op calls the two
    captures share place them."""
    counted = 0
    for assignment in plans(unit_views).values():
        checked, wrong = misplaced_copies(unit_views, "default", "math", assignment)
        assert wrong == []
        counted += checked
    assert counted > 50


def replicas(raws, unit_views) -> dict[str, Replica]:
    out = {}
    for d in DEVICES:
        captured = Captured(raws[d], None, None, [(d, i) for i in range(len(raws[d].nodes))], (), None, context=d)
        out[d] = Replica(captured, unit_views[d].program, units=unit_views[d])
    return out


def test_the_graph_runs_each_unit_as_its_own_devices_launches(raws, unit_views):
    null = NullDriver()
    assignment = plans(unit_views)["attention on math"]
    built = build([Slot(replicas(raws, unit_views), assignment, "default")], overlap=False, driver=null)
    launches = [x for x in null.added if x.kind == "launch"]
    expected = [(d, node) for u, d in enumerate(assignment) for node in unit_views[d].nodes()[u]]
    assert [x.what for x in launches] == expected
    assert all(x.ctx == x.what[0] for x in launches)
    # outside attention the two captures launch alike, so the plan launches what the math capture does
    assert len(launches) == 163
    copies = [x for x in null.added if x.kind == "copy"]
    assert len(copies) == len(built.copies) > 0
