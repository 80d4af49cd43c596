"""bench.edge_cost's control flow on the CPU: every plan of the edge experiment built by the real
executor through the null driver (kernels/cuda/null.py) over the captures two H200s made of the 8B
prefill step (tests/data/h200x2-disagg), gated, then timed; a plan that fails its gate is never
timed; each plan that copies gets a twin with its copies cut to zero bytes (four where the driver
refuses zero), timed and never gated; a plan the replicas cannot run is reported, never timed; and
the command's misuse gets one line."""

from pathlib import Path

import pytest
from recorded import twin_replicas

from bench import edge_cost
from kernelfleet.costs.links import LinkFit, LinkTable, MeasuredLink
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.doorway import DriverError
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.runtime.executor import Built, Slot, build, run
from kernelfleet.runtime.gate import IDENTICAL

pytestmark = pytest.mark.replay

RUNS = Path(__file__).parents[1] / "data" / "h200x2-disagg"
DEVICES = ("bandwidth", "compute")
SLOTS = 2
FAILS = "spread 2"  # the twin's gate refuses this plan
REFUSED = "cut 5"  # and its replicas cannot run this one


class NullRunner:
    """The GPU runner's twin: the executor's graphs on ``driver`` (but :data:`REFUSED`'s), a gate
    that passes all but :data:`FAILS`, and a time of 1 µs a node (what ran is what the driver recorded)."""

    def __init__(self, driver: NullDriver) -> None:
        self.driver = driver
        self.slots = [twin_replicas(RUNS, "llama8b-prefill", DEVICES, k) for k in range(SLOTS)]
        self.events: list[tuple[str, str]] = []
        self.copied: dict[str, list[int]] = {}  # graph name -> bytes of each copy the driver added

    def graph(self, name: str, assignments: list[list[str]], homes: list[str], **options) -> Built:
        if name == REFUSED:
            raise UsageError(f"{name}: the replicas cannot run it")
        first = len(self.driver.added)
        built = build([Slot(r, a, h) for r, a, h in zip(self.slots, assignments, homes)], resident_state=True,
                      driver=self.driver, **options)
        label = name + ("" if options.get("copy_cap_bytes") is None else " twin")
        self.copied[label] = [x.what[2] for x in self.driver.added[first:] if x.kind == "copy"]
        self.events.append(("built", label))
        return built

    def gate(self, built: Built, homes: list[str]) -> str:
        self.events.append(("gated", self.events[-1][1]))
        return "outputs differ from the single-device run (slot: elements) {0: 3}" \
            if self.events[-1][1] == FAILS else IDENTICAL

    def seconds(self, built: Built) -> float:
        run(built, 7)
        self.events.append(("timed", self.events[-1][1]))
        return 1e-6 * built.nodes


def table(n: int) -> CostTable:
    return CostTable([{d: 1e-5 for d in DEVICES}] * n, "twin", graph_seconds={d: 1e-5 * n for d in DEVICES})


def link() -> LinkTable:
    fit = LinkFit(1e-6, 3e12, [0, 1], [1e-6, 1e-6])
    return LinkTable([MeasuredLink(*DEVICES, fit, fit, 1.7e-6, 0.2e-6)], "twin")


@pytest.fixture(scope="module")
def measured():
    runner = NullRunner(NullDriver())
    program = runner.slots[0][DEVICES[0]].program
    plans, refused = edge_cost.measure_target("llama8b-prefill", runner, program, table(len(program.launches)),
                                              link(), SLOTS, DEVICES)
    return runner, plans, refused


def test_every_plan_is_gated_before_it_is_timed_and_a_failed_or_refused_one_is_never_timed(measured):
    runner, plans, refused = measured
    full = [p for p in plans if p.copy_cap_bytes is None]
    assert [p.name for p in full][:5] == ["single:bandwidth", "single:compute", "cut 2", "cut 3", "cut 9"]
    assert refused == ["llama8b-prefill cut 5: cut 5: the replicas cannot run it"] and len(full) == 2 + 5 + 6
    for p in full:
        events = [e for e, name in runner.events if name == p.name]
        assert events == (["built", "gated"] if p.name == FAILS else ["built", "gated", "timed"]), p.name
        assert (p.measured_seconds is None) == (p.name == FAILS)
        assert (p.counts.copies, p.counts.copy_bytes) == (len(runner.copied[p.name]), sum(runner.copied[p.name]))
        if p.measured_seconds is not None:  # what was timed is the graph counted
            assert p.measured_seconds == pytest.approx(1e-6 * p.counts.nodes)


def test_each_plan_that_copies_gets_a_zero_byte_twin_timed_but_never_gated(measured):
    runner, plans, _ = measured
    full = {p.name: p for p in plans if p.copy_cap_bytes is None}
    twins = {p.name.removesuffix(", copies 0 B"): p for p in plans if p.copy_cap_bytes is not None}
    assert set(twins) == {n for n, p in full.items() if p.counts.copies and p.measured_seconds}
    for name, twin in twins.items():
        assert [e for e, n in runner.events if n == name + " twin"] == ["built", "timed"]
        assert twin.copy_cap_bytes == 0 and runner.copied[name + " twin"] == [0] * full[name].counts.copies
        assert twin.counts.copy_bytes == 0 and twin.counts.copies == full[name].counts.copies
        assert twin.predicted_seconds < full[name].predicted_seconds  # the flags' model charges the bytes
        assert twin.gate.startswith("not gated")


def test_the_counts_grow_with_the_cuts_and_the_measured_link_predicts_beside_todays_model(measured):
    _, plans, _ = measured
    cuts = [p for p in plans if p.family == "cut" and p.copy_cap_bytes is None]
    assert [p.counts.waits for p in cuts] == sorted(p.counts.waits for p in cuts) and cuts[0].counts.copies > 0
    singles = [p for p in plans if p.family == "single"]
    assert all(p.counts.copies == 0 and p.predicted_link_seconds == p.predicted_seconds for p in singles)
    assert all(p.predicted_link_seconds < p.predicted_seconds for p in cuts)  # 1 µs a copy, not 4


class NoEmptyCopies(NullDriver):
    """A driver that refuses memcpy nodes of zero bytes, as a real one might."""

    def add_copy(self, graph, after, dst, src, length, ctx):
        if length == 0:
            raise DriverError.refused("cuGraphAddMemcpyNode", "CUDA_ERROR_INVALID_VALUE")
        return super().add_copy(graph, after, dst, src, length, ctx)


def test_a_driver_refusing_zero_bytes_gets_copies_of_four_by_the_same_method():
    runner = NullRunner(NoEmptyCopies())
    program = runner.slots[0][DEVICES[0]].program
    assignment = ["bandwidth"] * (len(program.launches) - 3) + ["compute"] * 3
    twin = edge_cost._zero_bytes(runner, edge_cost.models(table(len(program.launches)), None)[0], None,
                                 [assignment] * SLOTS, ["bandwidth"] * SLOTS, "memcpy",
                                 {"target": "t", "name": "tail", "family": "cut", "on_second": 3, "slots": SLOTS})
    assert twin.copy_cap_bytes == 4 and twin.method == "memcpy" and set(runner.copied["tail twin"]) <= {4}


@pytest.mark.parametrize("args, said", [
    ([], "give --out DIR (on a GPU) or --derive FILE"),
    (["--out", "x", "--slots", "0"], "--slots and --repeats must be at least 1"),
    (["--derive", "x.json", "--link", "missing.json"], "missing.json: cannot read"),
    (["--out", "OUT"], "no CUDA GPU here"),
])
def test_misuse_and_a_machine_without_a_gpu_get_one_line(args, said, tmp_path, capsys):
    assert edge_cost.main([str(tmp_path / "edges") if a == "OUT" else a for a in args]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and err.startswith("bench.edge_cost: error: ")
