"""The different-kernel pair as an H200 ran it (tests/data/h200-kernel-pair, recorded by
``KF_RECORD=DIR pytest -m gpu tests/gpu/test_kernel_pair.py``): two partitions of one GPU, a with
the default kernels (cuDNN attention), b with SDPA's math attention, each capturing the step
itself, through ``kernelfleet profile``, ``plan`` and ``bench disagg``, for a transformers Llama
prefill, the reference Llama decode step, and transformers Llama and Qwen2-MoE decode steps into
a static KV cache. Checked again on the CPU from what was recorded:

* the unit program ``profile`` wrote is what the two recorded captures line up into;
* every plan ``plan`` wrote passes the validator against it and the units' cost table;
* the benchmark's replicas (other weights, other addresses: a model per device) translate every
  copy of every recorded plan into bytes its unit touches on the other device;
* each strategy's recorded gate is bit-exact exactly when it runs no unit whose kernels differ
  away from its home, and within the tolerance otherwise — never outside it.
"""

import json
from pathlib import Path

import pytest
from recorded import misplaced_copies, touches

from kernelfleet.costs.table import CostTable
from kernelfleet.graph.units import differing_units, views
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.ir import Program
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.model import Device
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.gate import COSINE_FLOOR

pytestmark = pytest.mark.replay

DATA = Path(__file__).parents[1] / "data" / "h200-kernel-pair"
TARGETS = ("hf-llama-prefill", "llama-decode", "hf-llama-decode", "hf-qwen2moe-decode")
DEVICES = ("a", "b")


def unit_views(target: str, stage: str):
    raws = {d: RawCapture.load(DATA / target / f"{stage}.capture.{d}.json.gz" if stage == "profile"
                               else DATA / target / f"disagg.{d}.capture.json.gz") for d in DEVICES}
    return views(raws, {d: assemble(r) for d, r in raws.items()}, "a")


def split_plans(target: str):
    """Each recorded plan of ``target`` that runs on both devices: (its file, the plan, its home)."""
    for path in sorted((DATA / target).glob("plans.*.json")):
        plan = runtime_plans.read(path)
        if plan.assignment and len(set(plan.assignment)) > 1:
            yield path, plan, plan.details.home or "a"


@pytest.mark.parametrize("target", TARGETS)
def test_the_written_unit_program_is_what_the_captures_line_up_into(target):
    found = unit_views(target, "profile")
    written = Program.from_json((DATA / target / "profile.program.json").read_text())
    assert found["a"].program == written
    assert len(differing_units(found, "a")) == 2  # the two layers' attentions; every other unit launches alike


@pytest.mark.parametrize("target", TARGETS)
def test_every_written_plan_passes_the_validator_on_the_units(target):
    program = Program.from_json((DATA / target / "profile.program.json").read_text())
    costs = CostTable.from_json((DATA / target / "profile.costs.json").read_text())
    problem = runtime_plans.problem(program, [Device(d, 80 << 30) for d in DEVICES], costs)
    for path in sorted((DATA / target).glob("plans.*.json")):
        plan = runtime_plans.read(path)
        if plan.assignment:
            runtime_plans.checked(problem, plan, str(path))
            assert len(plan.assignment) == len(program.launches)


@pytest.mark.parametrize("target", TARGETS)
def test_every_copy_of_every_plan_lands_in_its_units_bytes_on_the_other_replica(target):
    found = unit_views(target, "disagg")
    assert found["a"].raw.regions[0].address != found["b"].raw.regions[0].address  # a model per device
    counted = 0
    for path, plan, home in split_plans(target):
        checked, wrong = misplaced_copies(found, home, "b" if home == "a" else "a", plan.assignment)
        assert wrong == [], path.name
        counted += checked
    assert counted > 20


@pytest.mark.parametrize("target", TARGETS)
def test_a_gate_is_bit_exact_exactly_when_no_differing_unit_runs_away_from_home(target):
    found = unit_views(target, "disagg")
    other_kernels = differing_units(found, "a")
    results = json.loads((DATA / target / "disagg.disagg.json").read_text())["strategies"]
    assert not [n for n, r in results.items() if not (r["gate"] == "identical" or r["gate"].startswith("within"))]
    checked = 0
    for path in sorted((DATA / target).glob("plans.*.json")):
        plan = runtime_plans.read(path)
        if not plan.assignment or plan.policy not in results:
            continue
        home = plan.details.home or "a"
        away = {u for u, d in enumerate(plan.assignment) if d != home}
        gate = results[plan.policy]["gate"]
        assert (gate == "identical") == (not away & other_kernels), (plan.policy, gate)
        if gate != "identical":
            cosine = float(gate.split("min cosine ")[1].split()[0])
            assert cosine >= COSINE_FLOOR and "seconds" in results[plan.policy]
            if target.startswith("hf-") and target.endswith("decode"):  # eight steps more, teacher-forced, then free
                forced = float(gate.split("teacher-forced over 8 decode steps: min cosine ")[1].split(",")[0])
                assert forced >= COSINE_FLOOR and "free-running greedy: 8 of 8 steps" in gate
        checked += 1
    assert checked >= 4


def test_the_profiler_refilled_the_moe_routing_histogram_before_each_replay():
    """Qwen2-MoE's routing counts (``histc``: a zero fill, then atomics onto it) are what made the
    grouped GEMM assert when the profiler replayed the count kernel on its own; it is replayed after
    its fill, one per MoE layer, and nothing else in the step gained a prelude."""
    from kernelfleet.kernels.cuda.replay import preludes, refills

    program = assemble(RawCapture.load(DATA / "hf-qwen2moe-decode" / "profile.capture.a.json.gz"))
    memsets = preludes(program)
    gained = [k for k, v in refills(program).items() if set(v) - set(memsets.get(k, ()))]
    assert [program.launches[k].op for k in gained] == ["aten.histc.default"] * 2


@pytest.mark.parametrize("target", TARGETS)
def test_with_the_measured_copy_cost_the_planner_says_what_the_gpu_measured_best(target):
    """Request distribution (replicas) measured fastest on every recorded row. Planned with copies
    free (``--copy-us 0``) the planner said kernel placement wins on the decode rows, and what it
    chose measured up to 3.2x replicas' time; with the per-copy cost measured on these partitions
    (the default) it says to run replicas, as measured."""
    from kernelfleet.plan import command, links

    results = json.loads((DATA / target / "disagg.disagg.json").read_text())["strategies"]
    timed = {n: r["seconds"] for n, r in results.items() if "seconds" in r and n in
             ("single:a", "single:b", "replicas", "pipeline", "attention-ffn", "latency-greedy", "throughput-milp")}
    assert min(timed, key=timed.get) == "replicas"
    said = {}
    for copy_us in (0.0, links.COPY_US):
        setup = command.setup(DATA / target / "profile.program.json", DATA / target / "profile.costs.json", [], [],
                              25.0, [], [], copy_us=copy_us)
        said[copy_us] = command.verdict(command.make_plans(setup.problem, "all", 10.0)[1])
    assert said[links.COPY_US].endswith("run replicas on this pair")
    if target.endswith("decode"):
        assert said[0.0].startswith("kernel placement serves")


def split_profile(tmp_path, target: str) -> list[Path]:
    """The recorded pair as two machines would have profiled it: a folder per device with its capture
    and a launch cost table (each launch's time here: its grid's blocks in nanoseconds, a stand-in
    that differs from launch to launch)."""
    from kernelfleet.profile.table import cost_table

    folders = []
    for device in DEVICES:
        folder = tmp_path / f"machine-{device}"
        folder.mkdir()
        source = DATA / target / f"profile.capture.{device}.json.gz"
        raw = RawCapture.load(source)
        program = assemble(raw)
        seconds = [(x.grid[0] * x.grid[1] * x.grid[2] if x.grid else 1) * 1e-9 for x in program.launches]
        (folder / f"launches.{device}.json").write_text(cost_table(raw, program, {device: seconds}, device).to_json())
        (folder / f"capture.{device}.json.gz").write_bytes(source.read_bytes())
        folders.append(folder)
    return folders


def test_profiles_of_separate_runs_merge_into_one_unit_program_and_table(tmp_path):
    from kernelfleet.analyze import merge_profiles

    folders = split_profile(tmp_path, "hf-qwen2moe-decode")
    said = merge_profiles(folders, tmp_path / "merged")
    assert "196 units" in said and "2 run other kernels" in said
    merged = tmp_path / "merged"
    assert Program.from_json((merged / "program.json").read_text()) == \
        Program.from_json((DATA / "hf-qwen2moe-decode" / "profile.program.json").read_text())
    costs = CostTable.from_json((merged / "costs.json").read_text())
    for device, folder in zip(DEVICES, folders):  # every launch's time lands in exactly one unit
        launches = CostTable.from_json((folder / f"launches.{device}.json").read_text())
        assert sum(row[device] for row in costs.seconds) == pytest.approx(sum(r[device] for r in launches.seconds))
    found = unit_views("hf-qwen2moe-decode", "profile")
    b_launches = CostTable.from_json((folders[1] / "launches.b.json").read_text())
    for u in differing_units(found, "a"):  # the math attention's launches, summed on b
        assert costs.seconds[u]["b"] == pytest.approx(sum(b_launches.seconds[i]["b"] for i in found["b"].launches[u]))
        assert len(found["b"].launches[u]) > len(found["a"].launches[u])


def test_a_merge_with_two_devices_of_one_name_is_one_line(tmp_path):
    import subprocess
    import sys

    first, second = split_profile(tmp_path, "llama-decode")
    for name in ("capture.b.json.gz", "launches.b.json"):
        (second / name).rename(second / name.replace(".b.", ".a."))
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "profile-merge", str(first), str(second), "--out",
                           str(tmp_path / "m")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "device 'a' is also in" in done.stderr
    (second / "launches.a.json").unlink()
    (first / "launches.a.json").unlink()
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "profile-merge", str(first), "--out",
                           str(tmp_path / "m")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "launches.a.json" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("target", TARGETS)
def test_each_rank_builds_its_units_from_its_own_capture_and_finds_every_copy_in_them(target):
    """``bench disagg-nccl`` on this pair: a process per device, each capturing with its own kernels
    (``runtime/ranks.py`` lines the ranks' captures up into units as one process does). Every
    recorded plan split across the two, built rank by rank on the null driver: a rank's graphs hold
    exactly its units' nodes of its own capture, and each copy it sends or receives is bytes that
    the unit writing or reading them touches in its own capture."""
    from recorded import twin_replicas

    from kernelfleet.kernels.cuda.null import NullDriver
    from kernelfleet.runtime.distributed import RankSlot, build_rank, release_rank
    from kernelfleet.runtime.executor import Replica
    from kernelfleet.runtime.replicas import units_across

    twins = twin_replicas(DATA / target, "disagg", DEVICES)
    units = units_across({d: r.captured.raw for d, r in twins.items()}, {d: r.program for d, r in twins.items()})
    assert units is not None and units["a"].program == unit_views(target, "disagg")["a"].program
    programs = {d: view.program for d, view in units.items()}
    built_plans = 0
    for path, plan, home in split_plans(target):
        for device in DEVICES:
            replica = Replica(twins[device].captured, programs[device], units=units[device])
            null = NullDriver()
            built = build_rank([RankSlot(programs, replica, plan.assignment, home, units)], device,
                               lambda address, length: (address, length), driver=null, overlap=False)
            mine = [u for u, d in enumerate(plan.assignment) if d == device]
            assert sorted(x.what for x in null.added if x.kind == "launch") == \
                sorted((device, 0, node) for u in mine for node in units[device].nodes()[u])
            for i, (address, length) in built.buffers.items():
                t = built.combined[built.ops[i].items[0]].node.copy
                unit, mode = (t.writer, "write") if built.ops[i].kind == "send" else (t.reader, "read")
                assert touches(programs[device], unit, address, length, mode), (path.name, device, t)
            release_rank(built)
            assert null.live == set()
        built_plans += 1
    assert built_plans >= 3
