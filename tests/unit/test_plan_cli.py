"""``kernelfleet plan`` on synthetic problems saved as JSON: the plans it writes pass the
independent validator, the Gantt chart is a real picture, and every bad input is one line
with exit code 2. Successful runs go through typer's CliRunner; bad inputs go through
``cli.main``, the entry point that turns a UsageError into its one line and exit code."""

import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kernelfleet.cli import app, main
from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.ir import Program
from kernelfleet.plan import command
from kernelfleet.plan.gantt import COLOURS
from kernelfleet.plan.model import Device, Link, Plan, Problem
from kernelfleet.plan.slots import per_request_modes
from kernelfleet.plan.synthetic import layered
from kernelfleet.plan.validate import check, evaluate
from kernelfleet.runtime import plans as runtime_plans

pytestmark = pytest.mark.unit
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def files(tmp_path):
    problem = layered(2, 2)  # devices l40s and a100, 23 launches
    (tmp_path / "program.json").write_text(problem.program.to_json())
    (tmp_path / "costs.json").write_text(problem.costs.to_json())
    return tmp_path


def plan_cli(*args):
    result = CliRunner().invoke(app, ["plan", *map(str, args)])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def problem_from(files, memory_bytes=None, gbps=25.0, copy_us=4.0):
    """The problem the CLI should have built (its default --copy-us is 4), rebuilt here without the
    CLI's code."""
    program = Program.load(files / "program.json")
    costs = CostTable.from_json((files / "costs.json").read_text())
    return Problem(
        program,
        [Device("a100", memory_bytes), Device("l40s", memory_bytes)],
        [Link("a100", "l40s", gbps * 1e9, copy_us * 1e-6)],
        costs,
    )


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def has_colour(pixels, hex_colour, tolerance=0.02):
    rgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(pixels[..., :3] - rgb).max(axis=-1) < tolerance).sum())


def test_throughput_plan_is_valid_and_the_gantt_chart_is_a_picture(files):
    out, chart = files / "plan.json", files / "plan.png"
    result = plan_cli(
        files / "program.json", files / "costs.json", "--out", out, "--gantt", chart, "--time-limit", 2
    )
    for name in (
        "* throughput-milp",
        "replicas",
        "single:l40s",
        "single:a100",
        "pipeline",
        "latency-greedy",
        "attention-ffn",
        "costs: synthetic roofline, 2 layers",
    ):
        assert name in result.stdout
    plan = Plan.from_json(out.read_text())
    problem = problem_from(files)
    check(problem, plan)
    assert plan.policy == "throughput-milp" and plan.details.costs_source == "synthetic roofline, 2 layers"
    assert evaluate(problem, plan).throughput_seconds == pytest.approx(plan.objective_seconds, rel=1e-6)
    width, height = png_size(chart)
    assert width > 600 and height > 150 and chart.stat().st_size > 10_000
    import matplotlib.image

    pixels = matplotlib.image.imread(chart)
    # the legend alone has ~200 pixels of each colour; GEMM boxes fill most of the device rows
    assert has_colour(pixels, COLOURS["tensor-core"]) > 20_000
    assert has_colour(pixels, COLOURS["memory-bound"]) > 1_000


def test_all_policies_write_every_plan_into_a_folder(files):
    folder = files / "plans"
    plan_cli(
        files / "program.json",
        files / "costs.json",
        "--policy",
        "all",
        "--out",
        folder,
        "--link",
        "a100:l40s:50",
        "--time-limit",
        2,
    )
    written = sorted(p.name for p in folder.iterdir())
    assert written == sorted(
        [
            "throughput-milp.json",
            "single-l40s.json",
            "single-a100.json",
            "replicas.json",
            "pipeline.json",
            "latency-greedy.json",
            "attention-ffn.json",
            "program.json",  # the program the plans place
        ]
    )
    problem = problem_from(files, gbps=50.0)
    assert Program.load(folder / "program.json").launches == problem.program.launches
    for path in folder.iterdir():
        if path.name != "program.json":
            check(problem, Plan.from_json(path.read_text()))


def test_memory_limits_force_a_split_and_rule_out_replicas(files):
    out = files / "plan.json"
    # the program needs ~1.25 GB on one device; 0.9 GB each leaves only split plans
    plan_cli(
        files / "program.json",
        files / "costs.json",
        "--device",
        "a100:0.9",
        "--device",
        "l40s:0.9",
        "--out",
        out,
        "--time-limit",
        2,
    )
    plan = Plan.from_json(out.read_text())
    problem = problem_from(files, memory_bytes=int(0.9e9))
    check(problem, plan)
    assert set(plan.assignment) == {"a100", "l40s"}
    assert all(used <= 0.9e9 for used in evaluate(problem, plan).memory_bytes.values())


def test_single_and_latency_policies(files):
    out = files / "plan.json"
    plan_cli(files / "program.json", files / "costs.json", "--policy", "single", "--out", out)
    plan = Plan.from_json(out.read_text())
    assert plan.policy == "single:a100"  # the A100 runs the whole synthetic step faster than the L40S
    check(problem_from(files), plan)
    plan_cli(
        files / "program.json",
        files / "costs.json",
        "--policy",
        "latency",
        "--out",
        out,
        "--gantt",
        files / "latency.png",
    )
    assert Plan.from_json(out.read_text()).policy == "latency-greedy"
    assert png_size(files / "latency.png")[0] > 600


def test_predicted_sku_is_added_and_the_plan_is_labelled(files):
    out = files / "plan.json"
    args = (
        files / "program.json",
        files / "costs.json",
        "--profile",
        "a100=a100-sxm-80gb",
        "--predict",
        "h100-sxm",
        "--out",
        out,
        "--time-limit",
        2,
    )
    result = plan_cli(*args)
    assert (
        "cost model: roofline fitted on a100, l40s" in result.stdout
        and "leave-one-device-out" in result.stdout
    )
    assert "h100-sxm" in result.stdout
    plan = Plan.from_json(out.read_text())
    assert plan.details.costs_source.startswith("roofline model fitted on a100, l40s (measured: synthetic")
    # the predicted H100 column matches the synthetic generator's own H100 roofline (989 TFLOP/s, 3.35 TB/s)
    problem = command.setup(
        files / "program.json", files / "costs.json", [], [], 25.0, ["h100-sxm"], ["a100=a100-sxm-80gb"]
    ).problem
    check(problem, plan)
    truth = layered(2, 4).costs.seconds  # its fourth device is the "h100" profile
    predicted = [row["h100-sxm"] for row in problem.costs.seconds]
    assert max(abs(p - t["h100"]) / t["h100"] for p, t in zip(predicted, truth)) < 0.02
    assert problem.memory_limit("h100-sxm") == 85_899_345_920  # the catalog's H100 SXM memory


def run_main(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "plan", *map(str, args)])
    with pytest.raises(SystemExit) as stop:
        main()
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--link", "l40s:h100:25"], "unknown device 'h100'"),
        (["--link", "l40s:a100"], "expected DEVICE:DEVICE:GBPS"),
        (["--device", "l40s:0.000001", "--device", "a100:0.000001"], "fits no device"),
        (["--predict", "h900"], "unknown GPU key 'h900'"),
        (["--predict", "h100-sxm"], "--profile a100=SKU"),  # "a100" is no catalog key: say which SKU it is
        (["--device", "h100-sxm"], "add --predict h100-sxm"),
        (["--device", "l40s:lots"], "expected NAME or NAME:MEMORY_GB"),
        (["--policy", "fastest"], "expected one of throughput, latency"),
        (["--device", "l40s:0.1", "--device", "a100:1.0", "--policy", "replicas"], "no valid replicas plan"),
        (["--in-flight", "0"], "--in-flight must be at least 1"),
        (["--copy-us", "-1"], "--copy-us must be between 0 and"),
        (["--copy-us", "1e9"], "--copy-us must be between 0 and"),
        (["--copy-us", "nan"], "--copy-us must be between 0 and"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(files, monkeypatch, capsys, extra, needle):
    code, err = run_main(
        monkeypatch, capsys, files / "program.json", files / "costs.json", "--time-limit", 1, *extra
    )
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("which", ["program", "costs", "corrupt"])
def test_missing_or_corrupt_files_are_one_line(files, monkeypatch, capsys, which):
    program, costs = files / "program.json", files / "costs.json"
    if which == "program":
        program = files / "none.json"
    elif which == "costs":
        costs = files / "none.json"
    else:
        costs.write_text('{"kernelfleet_costs": 1, "seconds": [')
    code, err = run_main(monkeypatch, capsys, program, costs)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("none.json: cannot read" if which != "corrupt" else "costs.json: not a cost table") in err


def test_verdict_names_the_stronger_of_placement_and_replicas():
    def plan(policy: str, seconds: float) -> Plan:
        return Plan(policy, [], seconds, 0.0, details={"throughput_seconds": seconds})

    assert command.verdict([plan("throughput-milp", 0.5), plan("replicas", 0.6)]).startswith(
        "kernel placement serves 1.20x")
    assert "run replicas on this pair" in command.verdict([plan("throughput-milp", 0.7), plan("replicas", 0.5)])
    assert command.verdict([plan("single:a", 1.0)]) is None


def test_in_flight_predicts_each_plan_as_the_executor_runs_it(files):
    done = plan_cli(files / "program.json", files / "costs.json", "--policy", "all", "--time-limit", 2,
                    "--in-flight", 3)
    assert "time/request, 3 in flight" in done.output
    assert "with 3 requests in flight the fastest is" in done.output


def test_plans_made_for_requests_in_flight_carry_the_slot_mode_predicted_fastest(files):
    plan_cli(files / "program.json", files / "costs.json", "--policy", "all", "--time-limit", 2, "--in-flight", 3,
             "--out", files / "plans")
    problem = problem_from(files)
    # the folder's plans as the executor's benchmarks load them: every file but the program written beside them
    assert Program.load(files / "plans" / "program.json").launches == problem.program.launches
    plans = runtime_plans.load(files / "plans", problem)
    assert {"throughput-milp", "latency-greedy", "pipeline"} <= set(plans)
    for policy, plan in plans.items():
        modes = per_request_modes(problem, plan, 3)
        assert plan.slot_mode == min(modes, key=modes.get), policy
    plan_cli(files / "program.json", files / "costs.json", "--policy", "pipeline", "--out", files / "one.json")
    assert Plan.load(files / "one.json").slot_mode == "sequential"  # made for no requests in flight


def test_near_ties_are_the_other_plans_within_3_percent_not_the_same_graph_under_another_name():
    predicted = {"replicas": 344.7e-6, "single:a, slots free": 346.6e-6, "throughput-milp, slots free": 346.6e-6,
                 "latency-greedy": 345.0e-6 * 1.04, "pipeline": 500e-6}
    assert command.near_ties(predicted) == ("replicas", ["single:a, slots free", "throughput-milp, slots free"])
    same = {"single:a, slots free": 1.0, "throughput-milp, slots free": 1.0, "pipeline": 1.2}
    assert command.near_ties(same) == ("single:a, slots free", [])  # the first name of a tie; no rival
    assert command.near_ties({}) == (None, [])


def test_in_flight_names_the_plans_the_model_cannot_tell_from_the_fastest():
    """Qwen2-MoE prefill on the H100 (tests/data/h100-place-pairs-5): request distribution predicted
    344.7 µs a request, one device with free slots 346.6 (under three plans' names); the latter ran
    3.8 % faster."""
    row = Path(__file__).parents[1] / "data" / "h100-place-pairs-5" / "hf-qwen2moe-prefill.same"
    done = plan_cli(row / "program.json.gz", row / "costs.json", "--device", "a", "--device", "b", "--policy", "all",
                    "--in-flight", 2, "--time-limit", 5)
    text = " ".join(done.output.split())
    assert "in flight the fastest is replicas (344.7 µs per request" in text
    assert ("within 3% of it, a tie to the model (its graph times move that much between runs): "
            "latency-greedy, slots free = single:a, slots free = throughput-milp, slots free (346.6 µs); "
            "time them on the devices before settling") in text
