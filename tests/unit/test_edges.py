"""A plan graph's cross-device edges (plan/edges.py): what is counted, along which critical chain;
the least-squares fit of their cost; the fit as a document; and contention.predict charging a fit
only where one is given. The experiment's plans (plan/edgerun.py): what each family places where."""

from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.contention import Contention, predict, spans
from kernelfleet.plan.edgerun import edge_plans
from kernelfleet.plan.edges import DEFAULT_TERMS, EdgeCounts, EdgeFit, Term, counts, critical_chain, fit
from kernelfleet.plan.schedule import Node
from kernelfleet.plan.slots import SlotNode
from kernelfleet.plan.transfers import Transfer

pytestmark = pytest.mark.unit

KERNEL, COPY = 10e-6, 3e-6
PROGRAM = Path(__file__).parents[1] / "data" / "h200-place-pairs" / "dit-denoise.same" / "program.json.gz"


def excursion() -> list[SlotNode]:
    """A kernel on a; its bytes to b; a kernel on b; its bytes back; a kernel on a reading them; and a
    kernel on a that waits for nobody across (after the first on a's stream)."""
    there, back = Transfer(1, 0, 1, 0, 0, 1000, "a", "b"), Transfer(3, 1, 2, 1, 0, 500, "b", "a")
    nodes = [Node(0, 0, None, ("a",), "compute:a", ()),
             Node(1, None, there, ("a", "b"), "link:a->b", (0,)),
             Node(2, 1, None, ("b",), "compute:b", (1,)),
             Node(3, 2, None, ("a",), "compute:a", (0,)),
             Node(4, None, back, ("b", "a"), "link:b->a", (2,)),
             Node(5, 3, None, ("a",), "compute:a", (3, 4))]
    return [SlotNode(0, n, n.deps) for n in nodes]


def seconds(x: SlotNode) -> float:
    return COPY if x.node.launch is None else KERNEL


def test_an_excursion_to_the_other_device_counts_its_copies_waits_forks_and_joins():
    graph = excursion()
    found = counts(graph, spans(graph, seconds, Contention(), "sequential"))
    # critical chain: kernel 0 -> copy -> kernel on b -> copy back -> the last kernel (kernel 3 ends first);
    # the one fork is kernel 0 (a's stream goes on), the one join the last kernel (after kernel 3 and the copy)
    assert critical_chain(graph, spans(graph, seconds, Contention(), "sequential")) == [0, 1, 2, 4, 5]
    assert found == EdgeCounts(nodes=6, copies=2, copy_bytes=1500, waits=4, forks=1, joins=1, critical_copies=2,
                               critical_waits=4, critical_forks=0)


def test_the_fit_recovers_the_costs_that_made_the_residuals_and_refuses_what_it_cannot_tell_apart():
    plans = [EdgeCounts(10, c, 100 * c, w, f, f, c, w, 0) for c, w, f in
             [(1, 2, 1), (2, 4, 3), (4, 9, 4), (8, 16, 9), (3, 5, 1)]]
    truth = {"critical_copies": 1.5e-6, "waits": 0.5e-6, "forks": 3e-6}
    rows = [(c, sum(v * c.value(t) for t, v in truth.items())) for c in plans]
    fitted = fit(rows, DEFAULT_TERMS, "synthetic")
    assert {t.name: t.seconds for t in fitted.terms} == pytest.approx(truth, rel=1e-9)
    assert fitted.rms_after_seconds == pytest.approx(0, abs=1e-12) and fitted.rms_before_seconds > 1e-6
    assert fitted.seconds(plans[0]) == pytest.approx(rows[0][1])
    with pytest.raises(UsageError, match="cannot tell the terms"):  # copies and critical copies move together
        fit(rows, ("copies", "critical_copies"))
    with pytest.raises(UsageError, match="1-3 different terms"):
        fit(rows, ("nodes",))
    with pytest.raises(UsageError, match="cannot fit 3 terms"):
        fit(rows[:2], DEFAULT_TERMS)


def test_a_fit_reads_back_as_it_was_written_and_a_bad_one_is_one_line(tmp_path: Path):
    fitted = EdgeFit([Term("forks", 3e-6)], 12, 5e-6, 2e-6, "an edge experiment")
    fitted.save(tmp_path / "fit.json")
    assert EdgeFit.load(tmp_path / "fit.json") == fitted
    (tmp_path / "bad.json").write_text(fitted.to_json().replace('"forks"', '"nodes"'))
    with pytest.raises(UsageError, match=r"bad.json: per-edge fit: terms.0: term must be one of"):
        EdgeFit.load(tmp_path / "bad.json")


def test_predict_charges_a_fit_only_where_one_is_given():
    graph = excursion()
    plain = predict(graph, seconds, Contention(), "sequential")
    assert plain == pytest.approx(3 * KERNEL + 2 * COPY) and Contention.of(None).edges is None
    fitted = EdgeFit([Term("critical_copies", 2e-6), Term("forks", 1e-6)], 5, 1e-6, 1e-6)
    charged = predict(graph, seconds, Contention(edges=fitted), "sequential")
    assert charged == pytest.approx(plain + 2 * 2e-6 + 1e-6)
    # in free slots sharing a device, too
    free = replace(Contention(free={"a": 1.0, "b": 1.0}), edges=fitted)
    assert predict(graph, seconds, free, "free") == pytest.approx(
        predict(graph, seconds, Contention(free={"a": 1.0, "b": 1.0}), "free") + 5e-6)


def test_the_experiments_plans_cut_the_order_and_spread_launches_leaving_pins_home():
    program = Program.load(PROGRAM)
    n = len(program.launches)
    plans = {name: (family, assignment) for name, family, assignment in edge_plans(program, "a", "b")}
    assert plans["single:a"] == ("single", ["a"] * n) and plans["single:b"] == ("single", ["b"] * n)
    cut = plans["cut 2"][1]
    assert cut == ["a"] * (n // 2) + ["b"] * (n - n // 2)  # the layer pipeline's shape
    switches = {name: sum(x != y for x, y in pairwise(a)) for name, (f, a) in plans.items() if f == "cut"}
    assert switches == {f"cut {s}": s - 1 for s in (2, 3, 5, 9, 17, 33)}
    assert {name: a.count("b") for name, (f, a) in plans.items() if f == "spread"} == {
        f"spread {m}": m for m in (1, 2, 4, 8, 16, 32)}
    pinned = replace(program, launches=[replace(x, pinned="test") if k == n // 2 else x
                                        for k, x in enumerate(program.launches)])
    for _, family, assignment in edge_plans(pinned, "a", "b"):
        assert family == "single" or assignment[n // 2] == "a"
