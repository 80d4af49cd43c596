"""The link measurement (profile/linkcost.py) on the null driver: it builds the graphs the executor
would (kernels copied into each partition's context, memcpy nodes in the destination's copy
context), and a twin that times each graph by its longest path, with known costs per kernel, per
copy and per wait across contexts, gets exactly those costs back from the fit."""

import json

import pytest

from kernelfleet.costs.links import LinkFit, LinkTable, MeasuredLink, find
from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.profile.linkcost import SIZES_BYTES, End, LinkGraphs, fit

pytestmark = pytest.mark.unit

KERNEL, FIXED, BANDWIDTH, WAIT, FORK = 3e-6, 1.5e-6, 200e9, 0.7e-6, 0.4e-6  # what the twin's GPU charges


def longest_path(driver: NullDriver, executable: str) -> float:
    """Seconds of the last graph the driver instantiated (``executable``'s): each node ends its own
    time after the latest of its dependencies, plus WAIT where that one ran in another context, or
    FORK where it ran in this one but another context waits for it too."""
    graph = f"graph{int(executable.removeprefix('exec')) - 1}"
    forked = {d for i in driver.nodes(graph) for d in driver.added[i].after if driver.added[d].ctx != driver.added[i].ctx}
    ends: dict[int, float] = {}

    def lag(d: int, ctx: str) -> float:
        return WAIT if driver.added[d].ctx != ctx else FORK if d in forked else 0.0

    for i in driver.nodes(graph):
        node = driver.added[i]
        start = max((ends[d] + lag(d, node.ctx) for d in node.after), default=0.0)
        own = KERNEL if node.kind == "launch" else FIXED + node.what[2] / BANDWIDTH
        ends[i] = start + own
    return max(ends.values())


def ends(driver: NullDriver) -> tuple[End, End]:
    # two partitions of one GPU: kernels in their green contexts, copies into either in the capture's
    return (End("a", "green0.0", "context0", "kernel-a", 0x1000), End("b", "green0.8", "context0", "kernel-b", 0x9000))


def test_the_fit_recovers_the_twins_copy_cost_bandwidth_wait_and_fork():
    driver = NullDriver()
    a, b = ends(driver)
    link = LinkGraphs(a, b, lambda exe: longest_path(driver, exe), driver).measure()
    assert (link.a, link.b) == ("a", "b")
    assert link.wait_seconds == pytest.approx(WAIT, rel=1e-9)
    assert link.fork_seconds == pytest.approx(FORK, rel=1e-9)
    # between kernels: the copy alone, its two waits taken off; queued: a copy in the copy context
    # after another in the same context, so no wait
    for measured in (link.between, link.queued):
        assert measured.seconds_per_copy == pytest.approx(FIXED, rel=1e-6)
        assert measured.bytes_per_second == pytest.approx(BANDWIDTH, rel=1e-6)
        assert measured.sizes_bytes == list(SIZES_BYTES)
    assert not driver.live  # every graph and executable freed


def test_the_graphs_are_the_executors_kernels_in_their_partitions_and_copies_in_the_destination_context():
    driver = NullDriver()
    a, b = ends(driver)
    graphs = LinkGraphs(a, b, lambda exe: 1e-3, driver, copies=2)
    graphs.kernels(True, 64)
    made = [(x.kind, x.ctx, x.what if x.kind == "launch" else x.what[:2]) for x in driver.added]
    assert made == [("launch", "green0.0", "kernel-a"), ("copy", "context0", (0x9000, 0x1000)),
                    ("launch", "green0.8", "kernel-b"), ("copy", "context0", (0x1000, 0x9000)),
                    ("launch", "green0.0", "kernel-a"), ("copy", "context0", (0x9000, 0x1000)),
                    ("launch", "green0.8", "kernel-b")]
    assert [x.after for x in driver.added] == [(), (0,), (1,), (2,), (3,), (4,), (5,)]  # one chain


def test_times_that_do_not_grow_with_the_bytes_give_no_bandwidth():
    with pytest.raises(UsageError, match="does not grow with the bytes"):
        fit((256, 4096), [5e-6, 5e-6])
    with pytest.raises(UsageError, match="at least two sizes"):
        LinkGraphs(*ends(NullDriver()), lambda exe: 1e-3, NullDriver()).measure((256, 256))
    assert fit((1000, 2000, 3000), [0.0, 4e-6, 4e-6]).seconds_per_copy == 0.0  # noise below zero is kept at 0


def test_a_link_document_round_trips_and_a_bad_one_is_one_line():
    f = LinkFit(2e-6, 1e11, [256, 4096], [2e-6, 2.1e-6])
    table = LinkTable([MeasuredLink("a", "b", f, f, 1e-6, 0.5e-6)], "twin")
    again = LinkTable.from_json(table.to_json(), "links.json")
    assert again == table and find(again.links, "b", "a") is again.links[0] and find(again.links, "a", "c") is None
    doc = json.loads(table.to_json())
    doc["links"][0]["wait_seconds"] = 5  # seconds: no wait across devices takes that long
    with pytest.raises(UsageError, match=r"^links.json: .*links\.0\.wait_seconds"):
        LinkTable.from_json(json.dumps(doc), "links.json")
    with pytest.raises(UsageError, match="two different devices"):
        MeasuredLink("a", "a", f, f, 0.0, 0.0)
