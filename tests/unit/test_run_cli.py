"""`kernelfleet run STEP --plan PLAN.json`: the product command that runs one plan outside bench.
On a machine without a GPU it stops with the one-line environment error; a bad plan file, or any
other bad input, is one line naming it, found before any GPU is looked for."""

import json
import sys
from types import SimpleNamespace

import pytest

from kernelfleet.cli import main
from kernelfleet.plan.model import Plan

pytestmark = pytest.mark.unit


def run_main(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "run", *map(str, args)])
    with pytest.raises(SystemExit) as stop:
        main()
    return stop.value.code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "pipeline.json"
    path.write_text(Plan("pipeline", ["compute", "bandwidth"], 0.1, details={"home": "compute"}).to_json())
    return path


def test_without_a_gpu_it_is_one_line_and_exit_3(monkeypatch, capsys, plan):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so it holds on a GPU machine too
    code, err = run_main(monkeypatch, capsys, "llama8b-decode", "--plan", plan)
    assert code == 3
    assert "running a plan runs on an NVIDIA GPU and none is visible here" in one_line(err)


@pytest.mark.parametrize(
    "text, needle",
    [
        (None, "nowhere.json: cannot read"),
        ("not json", "bad.json: not a plan: Invalid JSON"),
        ('{"kernelfleet_costs": 1, "seconds": []}', "expected kernelfleet_plan=1"),
        ('{"kernelfleet_plan": 1, "policy": "x"}', "bad.json: not a plan: assignment: Field required"),
        (Plan("replicas", [], 0.1, details={"replicas": ["compute", "bandwidth"]}).to_json(),
         "bad.json: a replicas plan shares requests between devices and places no launch"),
    ],
)
def test_a_bad_plan_file_is_one_line_naming_the_file_and_exit_2(monkeypatch, capsys, tmp_path, text, needle):
    path = tmp_path / ("nowhere.json" if text is None else "bad.json")
    if text is not None:
        path.write_text(text)
    code, err = run_main(monkeypatch, capsys, "llama8b-decode", "--plan", path)
    assert code == 2, err
    assert needle in one_line(err)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["llama9b-decode"], "unknown step 'llama9b-decode'"),
        (["llama8b-decode", "--repeats", "0"], "--repeats must be at least 1"),
        (["llama8b-decode", "--device", "compute:56@0", "--device", "compute:32@1"],
         "--device: give profiles with different names"),
        (["llama8b-decode", "--device", "compute:57@0"], "multiple of 8"),
        (["llama8b-decode", "--costs", "{tmp}/nowhere.costs.json"], "nowhere.costs.json: cannot read"),
    ],
)
def test_other_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, plan, args, needle):
    code, err = run_main(monkeypatch, capsys, *(a.format(tmp=tmp_path) for a in args), "--plan", plan)
    assert code == 2, err
    assert needle in one_line(err)


class TwinGate:
    """runtime.gate.Gate's surface on the CPU: a two-launch step whose first launch is pinned, the
    real Problem and slot check, and a gate that fails on request."""

    fails = False

    def __init__(self, make_step, profiles, slots, costs=None):
        from kernelfleet.kernels.ir import Access, Buffer, Launch, Program
        from kernelfleet.plan.model import Device
        from kernelfleet.runtime.plans import problem

        buffers = [Buffer(0, 0, 0, 1, "activation"), Buffer(1, 0, 1 << 32, 1, "activation")]
        launches = [Launch(0, "kernel", "k0", (Access(0, 0, 1, "write", "schema"),), pinned="global variable"),
                    Launch(1, "kernel", "k1", (Access(0, 0, 1, "read", "schema"), Access(1, 0, 1, "write", "schema")))]
        self.problem = problem(Program(buffers, launches), [Device(d) for d in profiles], costs)
        self.built, self.options, self.slots = [], [], slots
        TwinGate.last = self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def graph(self, name, assignments, homes, **options):
        from kernelfleet.runtime.plans import check_slots

        check_slots(self.problem, name, assignments, homes)
        self.built.append((assignments, homes))
        self.options.append(options)
        return SimpleNamespace(copies=[object()] * assignments[0].count("bandwidth"), copy_bytes=2_000_000)

    def gate(self, built, homes, stream):
        return "outputs differ from the single-device run (slot: elements) {0: 3}" if self.fails else "identical"


@pytest.fixture
def twin(monkeypatch):
    """`kernelfleet run` past the GPU check, on the twin gate: the real CLI, run_plan and validator."""
    import torch

    from kernelfleet import cli_place
    from kernelfleet.runtime import command

    released = []
    monkeypatch.setattr(cli_place, "_need_gpu", lambda what, instead: None)
    monkeypatch.setattr(cli_place, "_gpus_present", lambda profiles: None)
    monkeypatch.setattr(command, "Gate", TwinGate)
    monkeypatch.setattr(command, "release", released.append)
    monkeypatch.setattr(command, "median_seconds", lambda run, stream, repeats: 0.0125)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: SimpleNamespace(cuda_stream=1))
    monkeypatch.setattr(TwinGate, "fails", False)
    return released


def test_on_a_twin_gate_a_valid_plan_is_gated_timed_and_released(monkeypatch, capsys, twin, plan):
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "run", "llama8b-decode", "--plan", str(plan)])
    with pytest.raises(SystemExit) as stop:
        main()
    out = capsys.readouterr().out
    assert stop.value.code == 0
    assert "pipeline plan of llama8b-decode, home compute: gate identical" in out
    assert "12.500 ms per step (median of 10), 1 copies (2.0 MB)" in out
    assert len(twin) == 1


def test_on_a_twin_gate_a_plan_the_validator_refuses_is_one_line_naming_the_file(monkeypatch, capsys, twin, tmp_path):
    path = tmp_path / "moved.json"  # the pinned launch 0 away from home
    path.write_text(Plan("moved", ["bandwidth", "bandwidth"], 0.1, details={"home": "compute"}).to_json())
    code, err = run_main(monkeypatch, capsys, "llama8b-decode", "--plan", path)
    assert code == 2 and f"{path}: invalid moved plan: launch 0 is pinned" in one_line(err)
    path.write_text(Plan("other", ["compute", "a100"], 0.1).to_json())
    code, err = run_main(monkeypatch, capsys, "llama8b-decode", "--plan", path)
    assert code == 2 and f"{path}: invalid other plan: launch 1 uses a100, an unknown device" in one_line(err)
    assert twin == []  # nothing was built


def test_on_a_twin_gate_a_plan_failing_the_gate_is_reported_not_timed(monkeypatch, capsys, twin, plan):
    monkeypatch.setattr(TwinGate, "fails", True)
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "run", "llama8b-decode", "--plan", str(plan)])
    with pytest.raises(SystemExit) as stop:
        main()
    found = capsys.readouterr()
    assert stop.value.code == 1 and f"{plan}: the plan failed the gate and was not timed" in one_line(found.err)
    assert "gate outputs differ from the single-device run (slot: elements) {0: 3}" in found.out
    assert "ms per step" not in found.out and len(twin) == 1


def test_a_plan_made_for_requests_in_flight_runs_them_in_its_slot_mode(monkeypatch, capsys, twin, tmp_path):
    from kernelfleet.plan.model import InFlight

    path = tmp_path / "free.json"
    flight = InFlight(requests=2, chosen="no switch budget", per_request_seconds=0.05, candidates=[])
    path.write_text(Plan("pipeline", ["compute", "bandwidth"], 0.05, details={"home": "compute", "in_flight": flight},
                         slot_mode="free").to_json())
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "run", "llama8b-decode", "--plan", str(path)])
    with pytest.raises(SystemExit) as stop:
        main()
    out = capsys.readouterr().out
    gate = TwinGate.last
    assert stop.value.code == 0 and gate.slots == 2 and gate.options[0]["slot_mode"] == "free"
    assert len(gate.built[0][0]) == 2  # two slots, each the plan's assignment
    assert "pipeline plan of llama8b-decode, home compute, 2 slots free: gate identical" in out
    assert "12.500 ms per step of 2 requests, 6.250 ms per request (median of 10)" in out
    # --slots and --slot-mode override what the plan says
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "run", "llama8b-decode", "--plan", str(path), "--slots", "3",
                                      "--slot-mode", "sequential"])
    with pytest.raises(SystemExit):
        main()
    assert TwinGate.last.slots == 3 and TwinGate.last.options[0]["slot_mode"] == "sequential"


@pytest.mark.parametrize("args, needle", [
    (["--slot-mode", "parallel"], "--slot-mode 'parallel': expected one of sequential, free, scheduled"),
    (["--slots", "0"], "--slots must be at least 1, got 0"),
    (["--slots", "2", "--slot-mode", "scheduled"], ("scheduled slots order each device's nodes by their estimated "
                                                    "seconds: give --costs")),
])
def test_a_bad_slot_count_or_mode_is_one_line_before_any_gpu(monkeypatch, capsys, plan, args, needle):
    code, err = run_main(monkeypatch, capsys, "llama8b-decode", "--plan", plan, *args)
    assert code == 2 and needle in one_line(err)


def test_a_plans_slot_mode_is_validated_and_old_plans_run_sequential():
    from kernelfleet.errors import UsageError

    doc = json.loads(Plan("pipeline", ["compute", "bandwidth"], 0.1, slot_mode="scheduled").to_json())
    assert doc["slot_mode"] == "scheduled"
    del doc["slot_mode"]  # a plan written before the field
    assert Plan.from_json(json.dumps(doc)).slot_mode == "sequential"
    doc["slot_mode"] = "parallel"
    with pytest.raises(UsageError, match=r"plan.json: plan: slot_mode: slot_mode must be one of"):
        Plan.from_json(json.dumps(doc), "plan.json")
