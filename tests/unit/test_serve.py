"""The serving loop (runtime/serving.py) and `kernelfleet bench serve` on a simulated clock: launches take fixed times (the
latency graph 0.14 s per request, the throughput graph 0.35 s per launch of 3, request
distribution 0.30 s per launch of 3), so the loop, the monitor in it, the statistics and the SLO
capacity run exactly on the CPU. The GPU path (capture, gate, time, serve, serve.json) runs on a
CPU twin of the runtime's gate and executor. Bad command lines are one line, before any GPU is
looked for."""

import io
import json
import sys
from types import SimpleNamespace

import pytest

from kernelfleet.bench import disagg as disagg_bench
from kernelfleet.bench.serve import (
    LATENCY,
    MODES,
    REPLICAS,
    THROUGHPUT,
    arrival_times,
    parse_rates,
    percentile,
    slo_capacity,
    summary,
    sweep,
)
from kernelfleet.cli import main
from kernelfleet.errors import UsageError
from kernelfleet.runtime import gate as runtime_gate
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.monitor import Monitor
from kernelfleet.runtime.serving import serve

pytestmark = pytest.mark.unit

SECONDS = {LATENCY: 0.14, THROUGHPUT: 0.35, REPLICAS: 0.30}  # per launch
SLOTS = {LATENCY: 1, THROUGHPUT: 3, REPLICAS: 3}  # requests per launch


class Clock:
    """Simulated time: sleeping and launching advance it, nothing else does."""

    def __init__(self) -> None:
        self.t = 100.0  # the loop must count from its own start, not from zero

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.t += seconds


def simulate(mode, arrivals, check=lambda graph, n: 0, monitor=None):
    clock, launched = Clock(), []

    def launch(graph, n):
        assert 1 <= n <= SLOTS[graph]
        launched.append((graph, n))
        clock.t += SECONDS[graph]

    run = serve(arrivals, SLOTS, launch, check, clock.now, clock.sleep,
                graph=None if mode == "monitor" else mode, monitor=monitor)
    return run, launched


def test_every_arrival_is_served_once_in_order_with_its_latency_and_execution():
    run, launched = simulate(THROUGHPUT, [0.0, 0.1, 0.2, 0.25, 2.0])
    assert launched == [(THROUGHPUT, 1), (THROUGHPUT, 3), (THROUGHPUT, 1)]  # a K-slot graph takes what waits
    assert [s.arrival_seconds for s in run.served] == [0.0, 0.1, 0.2, 0.25, 2.0]
    assert [round(s.latency_seconds, 9) for s in run.served] == [0.35, 0.6, 0.5, 0.45, 0.35]
    assert all(round(s.done_seconds - s.launch_seconds, 9) == 0.35 for s in run.served)
    row = summary(run, 2.0, THROUGHPUT, arrival_window_seconds=2.0)
    assert row["served"] == 5 and row["dropped"] == 0 and row["corrupted"] == 0 and row["switches"] is None
    assert row["launches"] == {THROUGHPUT: 3} and row["slot_use_ratio"] == pytest.approx(5 / 9)
    assert row["drain_seconds"] == pytest.approx(0.35) and row["requests_per_second"] == pytest.approx(5 / 2.35)


def test_at_a_low_rate_the_monitor_stays_on_the_latency_plan():
    arrivals = arrival_times(0.5, 30.0, seed=0)
    run, launched = simulate("monitor", arrivals, monitor=Monitor(latency_capacity=1 / SECONDS[LATENCY]))
    assert run.switches == 0 and {g for g, _ in launched} == {LATENCY}
    row = summary(run, 0.5, "monitor", 30.0)
    assert row["served"] == len(arrivals) > 5 and row["dropped"] == 0
    assert row["p50_ms"] == pytest.approx(140.0)  # most requests find the device idle
    assert row["p99_ms"] < 2 * 140.0  # the worst waited for less than one other request


def test_at_a_rate_the_latency_plan_cannot_carry_the_monitor_switches_to_throughput():
    arrivals = arrival_times(8.0, 30.0, seed=0)  # the latency graph serves 7.1/s, the throughput graph 8.6/s
    run, launched = simulate("monitor", arrivals, monitor=Monitor(latency_capacity=1 / SECONDS[LATENCY]))
    assert run.switches >= 1 and launched[-1][0] == THROUGHPUT
    assert sum(n for g, n in launched if g == THROUGHPUT) > 0.9 * len(arrivals)
    row = summary(run, 8.0, "monitor", 30.0)
    assert row["served"] == len(arrivals) and row["dropped"] == 0 and row["corrupted"] == 0
    alone = summary(simulate(LATENCY, arrivals)[0], 8.0, LATENCY, 30.0)
    assert row["p99_ms"] < alone["p99_ms"] / 2 and row["drain_seconds"] < alone["drain_seconds"]


def test_a_failing_check_counts_the_launchs_requests_as_corrupted():
    checked = []

    def check(graph, n):
        checked.append((graph, n))
        return n if len(checked) == 2 else 0  # the second launch's outputs differ

    run, launched = simulate(THROUGHPUT, [0.0, 0.1, 0.2, 0.25, 2.0], check)
    assert checked == launched and run.corrupted == 3
    assert summary(run, 2.0, THROUGHPUT, 2.0)["corrupted"] == 3


def test_slo_capacity_is_the_highest_rate_within_the_target_with_nothing_lost():
    def row(mode, rate, p99, dropped=0, corrupted=0):
        return {"mode": mode, "rate_per_second": rate, "p99_ms": p99, "dropped": dropped, "corrupted": corrupted}

    rows = [row(LATENCY, 2, 200), row(LATENCY, 4, 450), row(LATENCY, 6, 900),
            row(THROUGHPUT, 2, 480), row(THROUGHPUT, 4, 400), row(THROUGHPUT, 6, 300, dropped=1),
            row(REPLICAS, 2, 300), row(REPLICAS, 4, 350, corrupted=2), row(REPLICAS, 6, 490),
            row("monitor", 2, 600), row("monitor", 4, None)]
    assert slo_capacity(rows, 500) == {LATENCY: 4, THROUGHPUT: 4, REPLICAS: 6, "monitor": None}


def test_the_sweep_serves_every_mode_on_the_same_arrivals_and_finds_each_capacity():
    def run_mode(mode, arrivals):
        seen.append(tuple(arrivals))
        monitor = Monitor(latency_capacity=1 / SECONDS[LATENCY]) if mode == "monitor" else None
        return simulate(mode, arrivals, monitor=monitor)[0]

    seen: list = []
    rows = sweep([1.0, 4.0, 8.0], 30.0, SLOTS, run_mode)
    assert [(r["rate_per_second"], r["mode"]) for r in rows] == [(r, m) for r in (1.0, 4.0, 8.0) for m in MODES]
    per_rate = [set(seen[k:k + len(MODES)]) for k in range(0, len(seen), len(MODES))]
    assert [len(s) for s in per_rate] == [1, 1, 1]  # every mode of a rate serves the same arrivals
    # p99 ms at 1, 4, 8 requests/s: latency 258, 504, 4361 (past 7.1/s it falls behind); throughput
    # 659, 757, 1863 (8.6/s at most); replicas 559, 647, 1296; the monitor 258, 771, 1863
    assert slo_capacity(rows, 600) == {LATENCY: 4.0, THROUGHPUT: None, REPLICAS: 1.0, "monitor": 1.0}
    assert slo_capacity(rows, 1500) == {LATENCY: 4.0, THROUGHPUT: 4.0, REPLICAS: 8.0, "monitor": 4.0}
    assert slo_capacity(rows, 200) == dict.fromkeys(MODES)


def test_a_mode_whose_graph_failed_the_gate_is_reported_not_served():
    rows = sweep([2.0], 5.0, {THROUGHPUT: 3, REPLICAS: 3}, lambda mode, a: simulate(mode, a)[0])
    by_mode = {r["mode"]: r for r in rows}
    assert "latency graph failed the gate" in by_mode[LATENCY]["not_served"]
    assert "latency graph failed the gate" in by_mode["monitor"]["not_served"]
    assert by_mode[THROUGHPUT]["served"] == by_mode[THROUGHPUT]["arrivals"]
    with pytest.raises(UsageError, match="no graph for latency"):
        serve([0.0], {THROUGHPUT: 3}, None, None, None, None, monitor=Monitor())


def test_arrivals_rates_and_percentiles():
    times = arrival_times(4.0, 10.0, seed=3)
    assert times == sorted(times) and times[-1] <= 10.0 and 20 < len(times) < 60
    assert times == arrival_times(4.0, 10.0, seed=3) != arrival_times(4.0, 10.0, seed=4)
    slower = arrival_times(2.0, 20.0, seed=3)  # one seed, one pattern: half the rate, twice the gaps
    assert slower == pytest.approx([2 * t for t in times])
    assert parse_rates("2, 4,6.5") == [2.0, 4.0, 6.5]
    for bad in ("", ",", "2,-4", "2,0", "two", "nan"):
        with pytest.raises(UsageError, match="--rates"):
            parse_rates(bad)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0] * 99 + [5.0], 99) == 1.0
    assert percentile(list(range(1, 51)), 99) == 50 and percentile([], 99) is None


def run_main(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "bench", "serve", *map(str, args)])
    with pytest.raises(SystemExit) as stop:
        main()
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["llama8b-prefill", "--plans", "{tmp}/nowhere"], "nowhere: no such folder"),
        (["llama9b-prefill", "--plans", "{plans}"], "unknown step 'llama9b-prefill'"),
        (["llama8b-prefill", "--plans", "{plans}", "--slots", "1"], "--slots must be at least 2"),
        (["llama8b-prefill", "--plans", "{plans}", "--rates=-2,4"], "--rates wants one or more positive"),
        (["llama8b-prefill", "--plans", "{plans}", "--rates", ""], "--rates wants one or more positive"),
        (["llama8b-prefill", "--plans", "{plans}", "--seconds", "0"], "--seconds must be > 0"),
        (["llama8b-prefill", "--plans", "{plans}", "--throughput-slots", "scheduled"], "expected free or sequential"),
        (["llama8b-prefill", "--plans", "{plans}", "--device", "compute:56@0"], "--device: give two profiles"),
        (["llama8b-prefill", "--plans", "{tmp}"], "no latency-greedy.json, throughput-milp.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, needle):
    plans = tmp_path / "plans"
    plans.mkdir()
    for name in ("latency-greedy.json", "throughput-milp.json"):
        (plans / name).write_text("{}")  # only their presence is checked before the GPU is
    code, err = run_main(monkeypatch, capsys, *(a.format(tmp=tmp_path, plans=plans) for a in args))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


class TwinGate:
    """runtime.gate.Gate's surface on the CPU: each slot's outputs one small tensor per device."""

    def __init__(self, make_step, profiles, slots, costs=None):
        import torch

        self.devices = list(profiles)
        self.program = SimpleNamespace(launches=[None] * 4)
        self.problem = None  # the twin's plans are given, not loaded
        self.references = [{d: [torch.tensor([k, 7])] for d in self.devices} for k in range(slots)]
        self.slots = [{d: SimpleNamespace(captured=SimpleNamespace(output_tensors=lambda t=[torch.zeros(2)]: t))
                       for d in self.devices} for _ in range(slots)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def graph(self, name, assignments, homes, **options):
        return SimpleNamespace(name=name, homes=homes)

    def gate(self, built, homes, stream):
        twin_run(built, 1)
        return "outputs differ (twin)" if built.name.startswith("latency") and TWIN.gate_fails else "identical"

    # the real output bookkeeping, on the twin's slots and references
    clear_outputs = runtime_gate.Gate.clear_outputs
    differing = runtime_gate.Gate.differing


def twin_measure(gate, strategy, repeats, stream, seconds=None):
    return {"gate": "identical", "slots_per_second": {"compute": 6.0, "bandwidth": 4.0}[strategy.homes[0]]}


TWIN = SimpleNamespace(gate_fails=False, corrupt=False, bench=None)  # what the twin does, and its gate


def twin_run(built, stream):
    """A launch: writes every slot's reference outputs (one element off under TWIN.corrupt) after 5 ms."""
    import time

    assert stream, "the executor never launches on the legacy default stream"
    time.sleep(0.005)
    for k, home in enumerate(built.homes):
        out, = TWIN.bench.slots[k][home].captured.output_tensors()
        out.copy_(TWIN.bench.references[k][home][0])
        if TWIN.corrupt and "throughput" in built.name:
            out[0] += 1


@pytest.fixture
def twin(monkeypatch, tmp_path):
    import torch

    from kernelfleet.plan.model import Plan
    from kernelfleet.profile import timing
    from kernelfleet.profile.devices import ProfileSpec
    from kernelfleet.runtime import executor

    def bench(*args):
        TWIN.bench = TwinGate(*args)
        return TWIN.bench

    released = []
    plans = {"latency-greedy": Plan("latency-greedy", ["compute", "bandwidth"] * 2, 0.1, details={"home": "compute"}),
             "throughput-milp": Plan("throughput-milp", ["bandwidth"] * 4, 0.1, details={"home": "bandwidth"})}
    monkeypatch.setattr(runtime_gate, "Gate", bench)
    monkeypatch.setattr(runtime_plans, "load", lambda folder, problem: plans)
    monkeypatch.setattr(disagg_bench, "measure", twin_measure)
    monkeypatch.setattr(executor, "run", twin_run)
    monkeypatch.setattr(executor, "release", released.append)
    monkeypatch.setattr(timing, "median_seconds", lambda run, stream, repeats: 0.005)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: SimpleNamespace(cuda_stream=1, synchronize=lambda: None))
    profiles = {"compute": ProfileSpec("compute", 56, 64, 0), "bandwidth": ProfileSpec("bandwidth", 32, None, 1)}

    def go(gate_fails=False, corrupt=False):
        from rich.console import Console

        from kernelfleet.bench.serve import bench_serve

        TWIN.gate_fails, TWIN.corrupt = gate_fails, corrupt
        console = Console(width=200, record=True, file=io.StringIO())
        results = bench_serve(None, profiles, tmp_path, 3, [20.0], 0.3, 500.0, 0.3, 1.5, 3, tmp_path / "out", console)
        return results, json.loads((tmp_path / "out" / "serve.json").read_text()), released, console.export_text()

    return go


def test_the_gpu_path_gates_serves_every_mode_and_writes_serve_json_on_a_cpu_twin(twin):
    results, written, released, table = twin()
    assert written["runs"] == json.loads(json.dumps(results["runs"]))
    graphs = written["graphs"]
    assert graphs[LATENCY]["homes"] == ["compute"] and graphs[THROUGHPUT]["homes"] == ["bandwidth"] * 3
    assert graphs[REPLICAS]["homes"] == ["compute", "compute", "bandwidth"]  # 6 : 4 req/s measured
    assert graphs[REPLICAS]["split"] == "by the measured single-device rates"
    assert graphs[LATENCY]["requests_per_second"] == pytest.approx(200.0) and len(released) == 3
    assert [r["mode"] for r in written["runs"]] == list(MODES)
    assert all(r["dropped"] == 0 and r["corrupted"] == 0 and r["served"] == r["arrivals"] > 0 for r in written["runs"])
    assert written["corrupted"] == 0 and set(written["slo_capacity"]) == set(MODES)
    assert "SLO capacity" in table and "command: kernelfleet" in table


def test_on_the_twin_a_graph_failing_the_gate_is_not_served_and_corruption_is_counted(twin):
    results, written, released, table = twin(gate_fails=True, corrupt=True)
    assert written["graphs"][LATENCY]["gate"] == "outputs differ (twin)" and "seconds" not in written["graphs"][LATENCY]
    by_mode = {r["mode"]: r for r in written["runs"]}
    assert "not_served" in by_mode[LATENCY] and "not_served" in by_mode["monitor"]
    assert by_mode[THROUGHPUT]["corrupted"] == by_mode[THROUGHPUT]["served"] > 0
    assert by_mode[REPLICAS]["corrupted"] == 0 and written["corrupted"] == by_mode[THROUGHPUT]["served"]
    assert written["slo_capacity"] == {THROUGHPUT: None, REPLICAS: 20.0} and "differ from their" in table
    assert len(released) == 3  # the refused graph at once, the served two at the end


def test_with_batched_throughput_graphs_the_monitor_does_not_flap_under_load():
    """A K-slot graph finishes K requests at once, which a one-window completion rate reads as a
    burst: the capacity guard measures the rate over seconds (runtime/monitor.py)."""
    for rate in (6.0, 7.0, 8.0):
        run, _ = simulate("monitor", arrival_times(rate, 60.0, seed=0),
                          monitor=Monitor(latency_capacity=1 / SECONDS[LATENCY]))
        assert run.switches <= 2, rate  # 17, 5 and 1 with a one-window rate and a 90 % threshold
