"""Units of placement across two captures with different kernels, on what an H200 recorded
(tests/data/h200-variants: a transformers Llama prefill with SDPA's cuDNN attention, and with its
math composition). Checked on the CPU: the op matching, the unit programs' flows against the
launch-level ones, the address translation of every copy, and the executor's graph through the
null driver."""

from collections import defaultdict
from pathlib import Path

import pytest
from recorded import misplaced_copies

from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import flows
from kernelfleet.graph.units import align, carried, differing_units, views
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.kernels.ir import merged_ranges
from kernelfleet.kernels.raw import RawCapture, program_nodes
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


def launch_plan(raws, start: int, end: int) -> list[str]:
    """The default capture's launches [start, end) on b, the rest on a."""
    return ["b" if start <= i < end else "a" for i in range(len(assemble(raws["default"]).launches))]


def chains(raw: RawCapture) -> list[list[int]]:
    return [[n] for n in program_nodes(raw)]


def test_a_plan_carried_to_its_own_capture_is_itself(raws):
    plan = launch_plan(raws, 40, 90)
    plan[7] = "b"  # a launch alone, inside an op of two launches (cumsum): carried launch by launch
    raw = raws["default"]
    assert carried(plan, chains(raw), raw, chains(raw), raw) == plan


def test_a_plan_carried_to_a_capture_of_other_kernels_moves_each_op_with_its_launches(raws, unit_views):
    """The math capture launches 17 kernels for each attention where the default launches cuDNN's 2:
    lined up by op name, each goes where the default's ran, and every other op's launches where its
    own did."""
    plan = launch_plan(raws, 40, 90)
    got = carried(plan, chains(raws["default"]), raws["default"], chains(raws["math"]), raws["math"])
    assert len(got) == len(assemble(raws["math"]).launches) == 163
    for u in range(len(unit_views["default"].ops)):
        assert {got[i] for i in unit_views["math"].launches[u]} <= {plan[i] for i in unit_views["default"].launches[u]}
    attention = attention_units(unit_views)
    assert [{got[i] for i in unit_views["math"].launches[u]} for u in attention] == [{"b"}, {"a"}]
    assert got.count("b") == sum(len(unit_views["math"].launches[u]) for u in range(len(unit_views["math"].ops))
                                 if plan[unit_views["default"].launches[u][0]] == "b")


def test_an_op_whose_launches_ran_on_two_devices_and_whose_kernels_differ_is_not_carried(raws, unit_views):
    first = unit_views["default"].launches[attention_units(unit_views)[0]]
    plan = launch_plan(raws, first[1], first[1] + 1)  # cuDNN's two attention launches split between a and b
    with pytest.raises(UsageError, match=r"^aten\._scaled_dot_product_cudnn_attention\.default: its launches run on "
                                         "a, b and the other capture launches other kernels for it"):
        carried(plan, chains(raws["default"]), raws["default"], chains(raws["math"]), raws["math"])


def test_a_plan_over_units_is_carried_to_the_units_of_another_capture(raws, unit_views):
    """Carried from the default capture's units to the math capture's (each placed launch a unit),
    a unit plan comes back as itself."""
    plan = ["b" if 30 <= u < 70 else "a" for u in range(len(unit_views["default"].ops))]
    assert carried(plan, unit_views["default"].nodes(), raws["default"], unit_views["math"].nodes(),
                   raws["math"]) == plan
