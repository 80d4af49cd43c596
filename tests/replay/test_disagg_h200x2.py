"""`kernelfleet bench disagg` on two H200s (tests/data/h200x2-disagg), replayed on the CPU.

The recorded runs: every placement strategy for five workloads' steps on the emulated pair
(compute: 56 SMs + a 64-SM copy hog on GPU 0; bandwidth: 32 SMs on GPU 1), three slots per graph
(two for the 20B MoE, whose three replicas would not fit beside each other), made by
`bash bench/disagg_run.sh run DIR` (docs/place.md). The DiT run hit its time limit after the
conservative 1-slot ablation. Beside them, both devices' captures of one slot of the 8B steps, from
the session-3 run, which the address translation between captures is checked on.
"""

import json
import random
from pathlib import Path

import pytest

from kernelfleet.bench.disagg import strategies
from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import flows
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.model import Device, Plan
from kernelfleet.plan.transfers import AddressMap, transfers
from kernelfleet.runtime.plans import load, problem

pytestmark = pytest.mark.replay

HERE = Path(__file__).parents[1] / "data"
RUNS = HERE / "h200x2-disagg"
DEVICES = ["compute", "bandwidth"]


def recorded(step: str) -> dict:
    return json.loads((RUNS / f"{step}.disagg.json").read_text())


def pair(step: str):
    return {d: assemble(RawCapture.load(RUNS / f"{step}.{d}.capture.json.gz")) for d in DEVICES}


STEPS = ["llama8b-decode", "llama8b-prefill", "moe20b-decode", "mamba7b-decode", "vlm7b-prefill", "dit-h200-denoise"]


@pytest.mark.parametrize("step", STEPS)
def test_only_strategies_that_passed_the_gate_were_timed(step):
    found = recorded(step)["strategies"]
    for name, r in found.items():
        assert ("seconds" in r) == (r["gate"] == "identical"), name
    assert all(found[f"single:{d}"]["gate"] == "identical" for d in DEVICES)
    assert found["replicas"]["gate"] == found["throughput-milp"]["gate"] == "identical"


@pytest.mark.parametrize("step", STEPS)
def test_every_plan_of_every_workload_gives_the_single_device_outputs(step):
    """The issue's first target: identical outputs on every plan, bit for bit, on two GPUs."""
    found = recorded(step)["strategies"]
    assert len(found) >= 15
    assert {name: r["gate"] for name, r in found.items() if r["gate"] != "identical"} == {}


def test_on_this_pair_request_distribution_beats_every_kernel_placement():
    """What the runs show (docs/place.md): on every workload two replicas serve the most slots per
    second; kernelfleet's throughput plan, in its best slot mode, reaches 0.63-0.83x of them (the
    decode steps' session-4 MILP plans; the re-profiled prefill, VLM and DiT plans, made for 3 in
    flight, 0.81-0.83x). The issue's 1.2x target is missed on all five."""
    for step in STEPS:
        found = recorded(step)["strategies"]
        rate = {n: r["slots_per_second"] for n, r in found.items() if "slots_per_second" in r}
        best = max(rate, key=rate.get)
        assert best.startswith("replicas"), (step, best)
        milp = max(v for n, v in rate.items() if n.startswith("throughput-milp"))
        assert 0.6 < milp / rate[best] < 0.85, step


@pytest.mark.parametrize("step", ["llama8b-decode", "llama8b-prefill", "vlm7b-prefill", "dit-h200-denoise"])
def test_the_per_kernel_profile_predicts_the_executed_graph(step):
    """A slot's time on one device, run as the executor's graph, against the sum of its kernels'
    times measured one by one on the same profile (tests/data/h200-capture): within 5 %. (Before the
    profiler replayed their memsets, prefill's graph ran 27 % and 37 % longer than its profile and
    DiT's 3×: docs/place.md, "The gap found".)"""
    profile = json.loads((HERE / "h200-capture" / f"{step}.profile.json").read_text())
    for device in DEVICES:
        run = recorded(step)["strategies"][f"single:{device}"]
        predicted = sum(profile["profiles"][device]["seconds"])
        assert run["seconds"] / run["slots"] == pytest.approx(predicted, rel=0.05), device


def test_request_distribution_splits_slots_by_measured_rate():
    rates = {"compute": 8.27, "bandwidth": 5.99}
    found = {s.name: s for s in strategies({}, DEVICES, 3, rates, 5)}
    assert found["replicas"].homes == ["compute", "compute", "bandwidth"]
    assert found["replicas"].assignments[2] == ["bandwidth"] * 5
    assert found["replicas, slots free"].options == {"slot_mode": "free"}
    assert [s.name for s in strategies({}, DEVICES, 3, None, 5)] == ["single:compute", "single:bandwidth"]


def test_plans_that_do_not_fit_the_captured_step_are_refused(tmp_path):
    program = pair("llama8b-decode")["compute"]
    n = len(program.launches)
    checked = problem(program, [Device(d) for d in DEVICES])  # what bench disagg checks its plans against

    def write(name: str, policy: str, assignment: list[str], **details) -> None:
        (tmp_path / name).write_text(Plan(policy, assignment, 0.07, details=details).to_json())

    write("short.json", "short", ["compute"])
    with pytest.raises(UsageError, match="made for another program"):
        load(tmp_path, checked)
    write("short.json", "odd", ["gpu9"] * n)
    with pytest.raises(UsageError, match="uses gpu9"):
        load(tmp_path, checked)
    write("short.json", "halves", ["compute"] * (n // 2) + ["bandwidth"] * (n - n // 2), home="compute")
    write("replicas.json", "replicas", [], replicas=DEVICES)
    assert list(load(tmp_path, checked)) == ["halves"]


def test_decode_flows_translate_alike_between_the_two_gpus_captures():
    programs = pair("llama8b-decode")
    home, other = programs["bandwidth"], programs["compute"]
    amap = AddressMap(home, other)
    n = len(home.launches)
    assignment = ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2)
    buffers = {b.id: b for b in home.buffers}
    moved = [t for t in transfers(home, assignment, "bandwidth", resident_state=True) if t.writer is not None]
    assert moved
    for t in moved:
        here = buffers[t.buffer].address + t.offset_bytes
        assert amap.translate([t.writer, t.reader], here, t.length_bytes) == \
            amap.translate([t.reader, t.writer], here, t.length_bytes)


def test_every_flow_is_placed_alike_by_its_writer_and_its_reader_on_both_gpus():
    """On both devices' captures of one prefill slot, for random plans, each copied range lands in
    the same place of the other capture whether the writer's or the reader's accesses place it: the
    flows are the step's dataflow, not artefacts of one capture's memory layout."""
    programs = pair("llama8b-prefill")
    home, other = programs["bandwidth"], programs["compute"]
    amap = AddressMap(home, other)
    buffers = {b.id: b for b in home.buffers}
    rng = random.Random(0)
    assignment = [rng.choice(DEVICES) for _ in home.launches]
    moved = [t for t in transfers(home, assignment, "bandwidth", resident_state=True)
             if t.writer is not None and t.reader is not None]
    assert len(moved) > 500
    for t in moved:
        here = buffers[t.buffer].address + t.offset_bytes
        assert amap.translate([t.writer, t.reader], here, t.length_bytes) == \
            amap.translate([t.reader, t.writer], here, t.length_bytes)


def test_launches_that_address_a_range_differently_are_refused():
    """cuDNN attention (launch 46) writes its fresh output where launch 28's result lay in the
    bandwidth GPU's capture, but not in the compute GPU's; placing those bytes by both is refused.
    The session-3 run, before own_reads, refused the attention/FFN plan for it, because 46 seemed to
    read 28's bytes; since own_reads no flow joins them and the rerun ran that plan bit-exact."""
    programs = pair("llama8b-prefill")
    home, other = programs["bandwidth"], programs["compute"]
    out = next(a for a in home.launches[46].accesses if a.own_reads)
    here = next(b.address for b in home.buffers if b.id == out.buffer) + out.offset_bytes
    with pytest.raises(UsageError, match="address it differently in the two captures"):
        AddressMap(home, other).translate([28, 46], here, out.length_bytes)
    assert not any(f.src == 28 and f.dst == 46 and f.buffer == out.buffer for f in flows(home)[0])
    assert recorded("llama8b-prefill")["strategies"]["attention-ffn"]["gate"] == "identical"


def test_list_scheduled_slots_are_a_strategy_once_costs_are_given():
    plan = Plan("throughput-milp", ["compute", "bandwidth"] * 2, 0.07, details={"home": "bandwidth"})
    rates = {"compute": 8.27, "bandwidth": 5.99}
    without = {s.name for s in strategies({"throughput-milp": plan}, DEVICES, 3, rates, 4)}
    found = {s.name: s for s in strategies({"throughput-milp": plan}, DEVICES, 3, rates, 4, lambda slot, n: 1e-3)}
    assert set(found) - without == {"throughput-milp, slots scheduled"}
    assert found["throughput-milp, slots scheduled"].options["slot_mode"] == "scheduled"


def test_the_table_compares_every_strategy_with_the_best_baseline_in_any_slot_mode():
    from rich.console import Console

    from kernelfleet.bench.disagg import show

    console = Console(width=220, record=True)
    show(recorded("llama8b-decode"), console)
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if line.startswith("│")}
    assert "1.00x" in rows["replicas, slots free"] and "0.58x" in rows["throughput-milp"]


NCCL_STEPS = ["llama8b-decode", "llama8b-prefill"]


@pytest.mark.parametrize("step", NCCL_STEPS)
def test_across_processes_every_plan_gives_the_single_device_outputs(step):
    """The same strategies with a process per GPU and NCCL between them (torchrun; bench
    disagg-nccl): every one run is bit-identical. Prefill's run came before the NCCL path paced
    links and set priorities, and its rows for those say so; decode's second run has them all."""
    found = json.loads((RUNS / f"{step}.disagg-nccl.json").read_text())
    assert found["processes"] == 2
    ran = {name: r for name, r in found["strategies"].items() if not r["gate"].startswith("not run")}
    assert len(ran) >= 15
    assert {name: r["gate"] for name, r in ran.items() if r["gate"] != "identical"} == {}
    assert all("priorities" in r["gate"] or "throttle" in r["gate"]
               for r in found["strategies"].values() if r["gate"].startswith("not run"))
    assert {r["method"] for r in ran.values()} == {"nccl"}
    if step == "llama8b-decode":
        assert len(ran) == len(found["strategies"]) == 20


def test_across_processes_a_paced_link_holds_each_copy_to_its_bandwidth():
    """The layer pipeline (2.0 GB of copies per 3-slot run) under the throughput policy's name, so
    bench disagg-nccl paces its copies: each rate costs at least its bytes over the link, and a
    slower link more."""
    found = json.loads((RUNS / "llama8b-decode.paced-pipeline.disagg-nccl.json").read_text())["strategies"]
    assert {r["gate"] for r in found.values()} == {"identical"}
    free = found["throughput-milp, slots free"]
    paced = [found[f"link {gbit} Gbit/s, slots free"] for gbit in (200, 100, 25)]
    assert free["seconds"] < paced[0]["seconds"] < paced[1]["seconds"] < paced[2]["seconds"]
    for gbit, r in zip((200, 100, 25), paced):
        assert r["copy_bytes"] == free["copy_bytes"] > 2e9
        assert r["seconds"] > r["copy_bytes"] / (gbit * 1e9 / 8)
    assert paced[2]["seconds"] > 2.5 * free["seconds"]


@pytest.mark.parametrize("step", NCCL_STEPS)
def test_across_processes_each_rank_can_hold_only_the_weights_its_launches_read(step):
    """bench disagg-nccl --place-weights pipeline: the layer pipeline with every weight everywhere,
    then with each rank's unread weights freed (2 slots): both bit-identical and equally fast, and
    the two ranks together freed one copy of the 16.1-GB weights per slot."""
    found = json.loads((RUNS / f"{step}.place-weights.disagg-nccl.json").read_text())["strategies"]
    every, placed = found["pipeline, every weight everywhere"], found["pipeline, weights placed"]
    assert every["gate"] == placed["gate"] == "identical"
    assert placed["seconds"] == pytest.approx(every["seconds"], rel=0.02)
    freed = sum(m["freed_bytes"] for m in placed["memory"].values())
    assert freed == pytest.approx(2 * 16.06e9, rel=0.01)
    for device in DEVICES:
        m = placed["memory"][device]
        assert 0.25 * 2 * 16.06e9 < m["freed_bytes"] < 0.75 * 2 * 16.06e9
        # at least the weights: the state saved again without them can be smaller too
        assert every["memory"][device]["allocated_bytes"] - m["allocated_bytes"] >= 0.99 * m["freed_bytes"]


def test_since_the_pointer_fix_each_rank_holds_its_captures_on_its_own_gpu():
    """Decode's --place-weights run again after driver.pointer_device asked the runtime: each
    rank's two slots took 35.8 GB on its own GPU and nothing on the other; the GPUs hold 77.4 and
    75.2 GB (93.5 and 53.0 before), the compute one with its hog's 1 GB."""
    found = json.loads((RUNS / "llama8b-decode.place-weights.disagg-nccl.json").read_text())
    for device, gpu in (("compute", "0"), ("bandwidth", "1")):
        stages = found["allocated_bytes_by_stage"][device]["slot 1 captured"]
        assert stages[gpu] == pytest.approx(2 * 35.8e9, rel=0.01)
        assert sum(v for g, v in stages.items() if g != gpu) == 0
    used = [m["device_used_bytes"] for m in found["strategies"]["pipeline, every weight everywhere"]["memory"].values()]
    assert abs(used[0] - used[1]) < 3e9


def test_before_the_pointer_fix_the_bandwidth_ranks_saved_state_lay_on_gpu_0():
    """The runs' bytes allocated per stage: each slot's capture on GPU 1 saved its state (9.7-11 GB
    for 8B decode) on GPU 0, because cuda-python's driver binding answered GPU 0 for every pointer
    (driver.pointer_device now asks the runtime); the compute rank's own slots took 34.4 GB each."""
    stages = json.loads((RUNS / "llama8b-decode.paced-pipeline.disagg-nccl.json").read_text())["allocated_bytes_by_stage"]
    compute, bandwidth = stages["compute"], stages["bandwidth"]
    assert compute["slot 0 captured"]["0"] == pytest.approx(34.4e9, rel=0.01) and compute["slot 0 captured"]["1"] == 0
    assert bandwidth["slot 0 captured"]["1"] == pytest.approx(24.7e9, rel=0.01)  # 16.1 GB weights + 8.6 GB cache
    assert bandwidth["slot 2 captured"]["0"] == pytest.approx(3 * 11.04e9, rel=0.01)


@pytest.mark.parametrize("step", NCCL_STEPS)
def test_across_processes_a_plan_costs_what_it_issues(step):
    """Against the one-graph executor of the same strategies: without copies the two run within
    2 % (one graph per slot either way, plus the processes' two barriers); each op a rank issues
    costs host time, so the plans that switch devices hundreds of times per slot fall behind."""
    one = recorded(step)["strategies"]
    many = json.loads((RUNS / f"{step}.disagg-nccl.json").read_text())["strategies"]
    for name in ("single:compute", "single:bandwidth", "replicas"):
        assert many[name]["seconds"] == pytest.approx(one[name]["seconds"], rel=0.02)
    timed = {name: r for name, r in many.items() if "seconds" in r}
    for name, r in timed.items():
        if r["segments"] > 500:  # the device-alternating plans: issuing is a third or more of the time
            assert r["issue_seconds"] > 0.3 * r["seconds"], name
        if r["segments"] < 20:
            assert r["issue_seconds"] < 0.02 * r["seconds"], name
    assert any(r["segments"] > 500 for r in timed.values()) and any(r["segments"] < 20 for r in timed.values())


def _best(found: dict, prefix: str) -> dict:
    rows = [r for name, r in found.items() if name.split(",")[0] == prefix and "slots_per_second" in r]
    return max(rows, key=lambda r: r["slots_per_second"])


DECODE_STEPS = ["llama8b-decode", "moe20b-decode", "mamba7b-decode"]
REPROFILED = ["llama8b-prefill", "vlm7b-prefill", "dit-h200-denoise"]  # run again on tables timed with preludes


@pytest.mark.parametrize("step", DECODE_STEPS)
def test_the_plan_made_for_three_requests_in_flight_beats_the_unconstrained_milp_but_not_replicas(step):
    """The second run of each decode workload with the throughput plan `kernelfleet plan --in-flight 3`
    chose (a cut or two, or a layer pipeline for Mamba), gated like the first: it gains over the
    session-4 MILP plan, which switched devices often, and request distribution still wins."""
    inflight = json.loads((RUNS / f"{step}.inflight.disagg.json").read_text())["strategies"]
    assert {name: r["gate"] for name, r in inflight.items() if r["gate"] != "identical"} == {}
    first = recorded(step)["strategies"]
    for found in (inflight, first):
        found["_base"] = _best(found, "replicas")
    now = _best(inflight, "throughput-milp")["slots_per_second"] / inflight["_base"]["slots_per_second"]
    before = _best(first, "throughput-milp")["slots_per_second"] / first["_base"]["slots_per_second"]
    assert now > before + 0.05
    assert 0.7 < now < 1.0


@pytest.mark.parametrize("step", DECODE_STEPS)
def test_on_decode_steps_the_in_flight_plans_graph_time_is_predicted_within_6_percent(step):
    found = json.loads((RUNS / f"{step}.inflight.disagg.json").read_text())["strategies"]
    r = _best(found, "throughput-milp")
    assert r["predicted_seconds"] == pytest.approx(r["seconds"], rel=0.06)


@pytest.mark.parametrize("step", REPROFILED)
def test_on_the_reprofiled_steps_chained_and_scheduled_graphs_are_predicted_within_6_percent(step):
    """Plans made on the re-profiled tables for 3 in flight (`bench/disagg_run.sh plans`): every
    single device, replica, pipeline and throughput-plan row whose slots are chained or list
    scheduled runs within 6 % of plan/slots.py's prediction (before the fix prefill's and VLM's
    ran 25-33 % over, DiT's 3.2×). Free slots contend for a device the model gives each slot whole,
    and copy-heavy plans (attention/FFN, the latency plan) pay for copies it does not see."""
    found = recorded(step)["strategies"]
    checked = [name for name, r in found.items() if r.get("predicted_seconds") and not any(
        word in name for word in ("free", "link", "attention-ffn", "latency-greedy"))]
    assert len(checked) >= 10
    for name in checked:
        assert found[name]["seconds"] == pytest.approx(found[name]["predicted_seconds"], rel=0.06), name
