"""The predictions with a measured link (costs/links.py): a copy between two devices costs what the
link measured, every dependency across streams adds its wait, in chained and free slots alike;
``kernelfleet plan`` prices copies with it and says which link model it used."""

from pathlib import Path

import pytest

from kernelfleet.costs.links import LinkFit, MeasuredLink
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.plan import command
from kernelfleet.plan.contention import Contention, predict
from kernelfleet.plan.schedule import Node
from kernelfleet.plan.slots import SlotNode, estimate, uniform_link
from kernelfleet.plan.synthetic import layered
from kernelfleet.plan.transfers import Transfer

pytestmark = pytest.mark.unit

KERNEL, COPY, WAIT = 10e-6, 3e-6, 1e-6


def link(wait: float = WAIT, fixed: float = 2e-6, rate: float = 1e9) -> MeasuredLink:
    f = LinkFit(fixed, rate, [0, 1000], [fixed, fixed + 1000 / rate])
    return MeasuredLink("a", "b", f, f, wait, 0.0)


def chain(slots: int = 1) -> list[SlotNode]:
    """Per slot: a kernel on a, its bytes copied to b, a kernel on b reading them."""
    copy = Transfer(1, 0, 1, 0, 0, 1000, "a", "b")
    nodes = [Node(0, 0, None, ("a",), "compute:a", ()), Node(1, None, copy, ("a", "b"), "link:a->b", (0,)),
             Node(2, 1, None, ("b",), "compute:b", (1,))]
    return [SlotNode(s, n, tuple(3 * s + d for d in n.deps)) for s in range(slots) for n in nodes]


def seconds(x: SlotNode) -> float:
    return COPY if x.node.launch is None else KERNEL


def test_each_wait_across_streams_is_added_to_the_chain_in_every_slot_mode():
    waits = Contention(waits={frozenset("ab"): WAIT})
    assert predict(chain(), seconds, Contention(), "sequential") == pytest.approx(2 * KERNEL + COPY)
    assert predict(chain(), seconds, waits, "sequential") == pytest.approx(2 * KERNEL + COPY + 2 * WAIT)
    # two free slots with the devices' free speedup measured: the same waits in the processor-sharing model
    free = Contention(free={"a": 1.0, "b": 1.0}, waits={frozenset("ab"): WAIT})
    both = predict(chain(2), seconds, free, "free")
    assert both == pytest.approx(predict(chain(2), seconds, Contention(free={"a": 1.0, "b": 1.0}), "free") + 2 * WAIT)


def test_the_cost_tables_link_prices_the_copies_and_sets_the_waits():
    problem = layered(1, 2)
    a, b = problem.names
    measured = MeasuredLink(a, b, *([LinkFit(2e-6, 1e9, [0, 1000], [2e-6, 3e-6])] * 2), WAIT, 0.0)
    costs = CostTable(problem.costs.seconds, "t", links=[measured])
    copy = Node(0, None, Transfer(0, None, 0, 0, 0, 1000, a, b), (a, b), f"link:{a}->{b}", ())
    today = uniform_link(4.0, 25.0)
    assert estimate(costs, today)(0, copy) == pytest.approx(3e-6)  # 2 µs + 1000 B at 1 GB/s
    assert estimate(problem.costs, today)(0, copy) == pytest.approx(4e-6 + 1000 / 25e9)  # unmeasured: the flags
    assert Contention.of(costs).waits == {frozenset((a, b)): WAIT}
    assert costs.restricted([a]).links is None  # a link needs both its ends
    assert costs.with_links([link()]).links == [measured]  # a link between other devices is not this table's


def test_plan_uses_the_measured_link_and_says_so(tmp_path: Path):
    problem = layered(1, 2)
    a, b = problem.names
    problem.program.save(tmp_path / "program.json")
    fits = [LinkFit(2e-6, 50e9, [0, 1000], [2e-6, 2.02e-6])] * 2
    measured = CostTable(problem.costs.seconds, "t", links=[MeasuredLink(a, b, *fits, WAIT, 0.0)])
    measured.save(tmp_path / "measured.json")
    problem.costs.save(tmp_path / "plain.json")
    done = command.setup(tmp_path / "program.json", tmp_path / "measured.json", [], [], 25.0, [], [], None, 4.0)
    assert done.problem.copy_seconds[a, b] == pytest.approx(2e-6 + 2 * WAIT)  # the copy and its two waits
    assert done.problem.bandwidth[a, b] == 50e9
    assert any(n.startswith(f"links: link {a}-{b} measured: a copy between kernels 2.00 µs") for n in done.notes)
    plain = command.setup(tmp_path / "program.json", tmp_path / "plain.json", [], [], 25.0, [], [], None, 4.0)
    assert plain.problem.copy_seconds[a, b] == pytest.approx(4e-6)
    assert "links: not measured in the cost table; every copy costs --copy-us 4 µs" in " ".join(plain.notes)


def test_a_devices_launch_table_keeps_its_links_and_a_merge_keeps_each_once():
    from kernelfleet.profile.table import StepTimes

    own = link()
    tables = {d: CostTable([{d: 1e-6}], d, graph_seconds={d: t}, links=[own]) for d, t in (("a", 1e-6), ("b", 2e-6))}
    merged = StepTimes({}, {}, {})
    for d, table in tables.items():  # as profile-merge reads each device's launches.DEVICE.json
        merged = merged.joined(StepTimes.of_table(table, d))
    assert merged.alone == {"a": 1e-6, "b": 2e-6} and merged.links == [own]
    assert StepTimes({"a": 1e-6}, {}, {}, [own]).of("c").links == []  # a device keeps only its own links
    with pytest.raises(UsageError, match="joins no device the table has a column for"):
        CostTable([{"c": 1e-6}], "c", links=[own])


def test_a_kernel_whose_bytes_a_copy_takes_holds_its_stream_by_the_fork():
    copy = Transfer(2, 0, None, 0, 0, 1000, "a", "b")
    nodes = [Node(0, 0, None, ("a",), "compute:a", ()), Node(1, None, copy, ("a", "b"), "link:a->b", (0,)),
             Node(2, 1, None, ("a",), "compute:a", (0,))]
    combined = [SlotNode(0, n, n.deps) for n in nodes]
    forked = Contention(waits={frozenset("ab"): WAIT}, forks={frozenset("ab"): 0.5e-6})
    assert forked.held(combined) == [0.5e-6, 0.0, 0.0]  # only the kernel another stream waits for
    # the second kernel on a starts the fork after the first; the copy its wait after it, and ends last
    assert predict(combined, seconds, forked, "sequential") == pytest.approx(max(2 * KERNEL + 0.5e-6, KERNEL + WAIT + COPY))
    free = Contention(free={"a": 1.0}, waits=forked.waits, forks=forked.forks)
    assert predict(combined, seconds, free, "free") == pytest.approx(2 * KERNEL + 0.5e-6)
