"""The plan folders ``kernelfleet serve --plans`` takes (serve/placed_plans.py), on the program and
plans an H200 recorded for a transformers Llama decode step (tests/data/h200-kernel-pair/hf-llama-decode:
device b with math attention, so a program of units). Checked: every missing piece is one line; the
recorded planners' plans do not keep the KV cache in one place (the latency plan splits each layer's
keys from its values, and on other devices than the throughput plan), which the server refuses; the
same planner run through ``kernelfleet plan --state-home`` (every launch that touches the cache pinned)
writes plans the server accepts, the cache at home, with the program they place beside them; a step
without state is refused in one line. Under memory caps below the step the planner splits the
weights, and ``--weights-like`` one plan keeps every plan's weights where that plan put them."""

import shutil
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.model import STATE_HOME, Device, Plan, state_home
from kernelfleet.plan.model import weights_read as plan_weights
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.serve.placed_plans import (Placement, kv_devices, kv_placement, planned_programs, read,
                                            slower_under_load, weights_read)
from kernelfleet.serve.placed_step import WEIGHTS_PREFIX

pytestmark = pytest.mark.replay

RECORDED = Path(__file__).parents[1] / "data" / "h200-kernel-pair" / "hf-llama-decode"
PAIRS = Path(__file__).parents[1] / "data" / "h200-place-pairs"
DEVICES = [Device("a", 80 << 30), Device("b", 80 << 30)]


@pytest.fixture(scope="module")
def program() -> Program:
    return Program.load(RECORDED / "profile.program.json")


def folder_of(root: Path, bucket: int, plans: dict[str, Path]) -> None:
    (root / f"batch-{bucket}").mkdir(parents=True)
    for file, source in plans.items():
        shutil.copy(source, root / f"batch-{bucket}" / f"{file}.json")


def recorded(root: Path, buckets=(1, 2), latency: str = "latency-greedy", throughput: str = "throughput-milp") -> Path:
    for bucket in buckets:
        folder_of(root, bucket, {"latency-greedy": RECORDED / f"plans.{latency}.json",
                                 "throughput-milp": RECORDED / f"plans.{throughput}.json"})
    return root


def test_a_missing_folder_bucket_or_plan_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no such folder"):
        read(tmp_path / "nowhere", [1, 2])
    recorded(tmp_path, buckets=(1,))
    with pytest.raises(UsageError, match=r"no plans for batch bucket 2 .*the server captures buckets 1, 2"):
        read(tmp_path, [1, 2])
    (tmp_path / "batch-1" / "throughput-milp.json").unlink()
    with pytest.raises(UsageError, match="batch-1: no throughput-milp.json"):
        read(tmp_path, [1])
    (tmp_path / "batch-1" / "throughput-milp.json").write_text("{not json")
    with pytest.raises(UsageError, match="throughput-milp.json") as found:
        read(tmp_path, [1])
    assert "\n" not in str(found.value)


def test_each_caches_device_under_a_plan_and_a_split_cache_refused(program):
    single_b = runtime_plans.read(RECORDED / "plans.single-b.json")
    assert set(kv_devices(program, single_b.assignment, "b").values()) == {"b"}
    assert len(kv_devices(program, single_b.assignment, "b")) == 4  # keys and values of both layers
    split = ["a"] * len(program.launches)
    split[45] = "b"  # layer 0's keys read by its clone there, written by index_copy_ (launch 43) on a
    with pytest.raises(UsageError, match=r"cache_0_keys is touched on a \(launch 43\) and on b \(launch 45\): a plan must keep"):
        kv_devices(program, split, "alternate")


def test_the_recorded_planners_plans_keep_the_cache_in_two_places_and_are_refused(program, tmp_path):
    found = read(recorded(tmp_path), [1, 2])
    problems = {b: runtime_plans.problem(program, DEVICES) for b in (1, 2)}
    with pytest.raises(UsageError, match="throughput-milp.json keeps cache_0_keys on a, .*latency-greedy.json on b: every bucket's and policy's plan must keep"):
        kv_placement(found, problems)


def test_plans_agreeing_on_the_cache_give_its_placement_and_what_prefill_copies_away(program, tmp_path):
    found = read(recorded(tmp_path, latency="pipeline", throughput="pipeline"), [1, 2])
    placement = kv_placement(found, {b: runtime_plans.problem(program, DEVICES) for b in (1, 2)})
    assert placement.home == "a"
    assert placement.away() == {"b": [(1, "keys"), (1, "values")]}  # the pipeline's second stage holds layer 1


def test_a_plan_made_for_another_model_is_refused_naming_its_file(program, tmp_path):
    for bucket in (1, 2):
        folder_of(tmp_path, bucket, {"latency-greedy": PAIRS / "hf-llama-decode.same" / "plan.latency-greedy.json",
                                     "throughput-milp": RECORDED / "plans.throughput-milp.json"})
    with pytest.raises(UsageError, match=r"batch-1/latency-greedy.json: invalid latency-greedy plan: plan assigns 122 "
                                         r"launches, program has 124"):
        kv_placement(read(tmp_path, [1, 2]), {b: runtime_plans.problem(program, DEVICES) for b in (1, 2)})


def test_plans_of_two_homes_are_refused(program, tmp_path):
    for bucket in (1, 2):
        folder_of(tmp_path, bucket, {"latency-greedy": RECORDED / "plans.single-b.json",
                                     "throughput-milp": RECORDED / "plans.single-a.json"})
    with pytest.raises(UsageError, match="home a, .*home b: every plan needs the same home"):
        kv_placement(read(tmp_path, [1, 2]), {b: runtime_plans.problem(program, DEVICES) for b in (1, 2)})


def test_the_planner_with_the_state_home_writes_plans_the_server_accepts(program, tmp_path):
    pinned = state_home(program)
    moved = [k for k, (x, y) in enumerate(zip(program.launches, pinned.launches)) if x.pinned != y.pinned]
    touching = {b.id for b in program.buffers if b.name and b.name.startswith("cache_")}
    assert moved == [launch.index for launch in program.launches if any(a.buffer in touching for a in launch.accesses)]
    assert all(pinned.launches[k].pinned == STATE_HOME for k in moved)
    program.save(tmp_path / "program.json")
    for bucket in (1, 2):  # one recorded program stands for both buckets' (the same step at two batch sizes)
        done = subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(tmp_path / "program.json"),
                               str(RECORDED / "profile.costs.json"), "--device", "a", "--device", "b", "--policy",
                               "all", "--state-home", "--time-limit", "20", "--out", str(tmp_path / "plans" / f"batch-{bucket}")],
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        assert f"state home: the {len(moved)} launches that touch the step's state are pinned" in done.stdout
    found = read(tmp_path / "plans", [1, 2])
    # beside the plans, the program they place, as planned (its state pinned): the server reads it before loading
    assert all(planned.launches == pinned.launches for planned in planned_programs(tmp_path / "plans", found).values())
    placement = kv_placement(found, {b: runtime_plans.problem(program, DEVICES) for b in (1, 2)})
    assert placement == Placement("a", {f"cache_{layer}_{kind}": "a" for layer in (0, 1) for kind in ("keys", "values")})
    assert placement.away() == {}
    plans = [plan for policies in found.values() for _, plan in policies.values()]
    assert any(set(plan.assignment) == {"a", "b"} for plan in plans)  # the rest still moves: a placement, not one device
    assert all((plan.details.home or "a") == "a" for plan in plans)  # --state-home keeps home: no plan re-homed on b


def test_plans_under_caps_smaller_than_the_model_split_its_weights_and_the_folder_says_who_reads_which(program,
                                                                                                   tmp_path):
    """``kernelfleet plan --device a:GB --device b:GB --state-home`` with caps under what the whole
    step touches (4.5 MB: its cache 0.5 MB, weights 3.4 MB): single devices are left out, and the
    weights each device's launches read, by the program written beside the plans, fit neither
    alone; between them they are every weight the step reads (what ``serve --plans`` loads where)."""
    from kernelfleet.plan.validate import _memory

    state_home(program).save(tmp_path / "program.json")
    caps = {"a": 0.0025, "b": 0.0035}
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(tmp_path / "program.json"),
                           str(RECORDED / "profile.costs.json"), *(f"--device={d}:{gb}" for d, gb in caps.items()),
                           "--policy", "all", "--state-home", "--time-limit", "20", "--out",
                           str(tmp_path / "plans" / "batch-1")], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert "single:a" not in done.stdout and "single:b" not in done.stdout  # neither holds the step
    found = read(tmp_path / "plans", [1])
    programs = planned_programs(tmp_path / "plans", found)
    problem = runtime_plans.problem(programs[1], [Device(d, int(gb * 1e9)) for d, gb in caps.items()])
    for _, plan in found[1].values():
        assert all(used <= caps[d] * 1e9 for d, used in _memory(problem, plan.assignment).items())
    read_by = {d: weights_read(found, programs, d, WEIGHTS_PREFIX) for d in caps}
    weights = {b.name.removeprefix(WEIGHTS_PREFIX) for b in program.buffers if b.role == "weight"}
    assert read_by["a"] and read_by["b"] and read_by["a"] | read_by["b"] == weights
    assert read_by["a"] != weights and read_by["b"] != weights
    (tmp_path / "plans" / "batch-1" / "program.json").unlink()
    with pytest.raises(UsageError, match=r"batch-1: no program.json, the program its plans place \(`kernelfleet plan"):
        planned_programs(tmp_path / "plans", found)


def test_plans_made_weights_like_one_plan_keep_its_weights_on_each_device_whatever_their_policy(program, tmp_path):
    """``kernelfleet plan --weights-like PLAN``: every launch that reads a weight PLAN placed runs
    where PLAN keeps it, so under each of the plans (every policy, here of the same recorded step
    as a second bucket's) each device reads the very weights PLAN gave it: a server switching
    between them holds one plan's share a device, not the union of several."""
    state_home(program).save(tmp_path / "program.json")
    caps = ["--device=a:0.0025", "--device=b:0.0035"]

    def plan(out: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(tmp_path / "program.json"),
                               str(RECORDED / "profile.costs.json"), *caps, "--policy", "all", "--state-home",
                               "--time-limit", "20", "--out", str(out), *extra],
                              capture_output=True, text=True, timeout=600, check=False)

    assert plan(tmp_path / "reference").returncode == 0
    reference = Plan.load(tmp_path / "reference" / "throughput-milp.json")
    done = plan(tmp_path / "plans" / "batch-1", "--weights-like", str(tmp_path / "reference" / "throughput-milp.json"))
    assert done.returncode == 0, done.stderr
    assert "weights like" in done.stdout
    found = read(tmp_path / "plans", [1])
    programs = planned_programs(tmp_path / "plans", found)
    unguided = {1: {policy: (path, Plan.load(path)) for policy, path in
                    (("throughput", tmp_path / "reference" / "throughput-milp.json"),
                     ("latency", tmp_path / "reference" / "latency-greedy.json"))}}
    grew = []
    for device in ("a", "b"):
        share = {name.removeprefix(WEIGHTS_PREFIX) for name in plan_weights(program, reference.assignment, device)}
        assert share and weights_read(found, programs, device, WEIGHTS_PREFIX) == share
        grew.append(weights_read(unguided, {1: program}, device, WEIGHTS_PREFIX) > share)
    assert any(grew)  # the reference folder's own two plans, made without it, need more on some device


def test_weights_like_refuses_a_launch_whose_weights_it_keeps_apart_and_a_plan_without_its_program(program, tmp_path):
    """A launch reading two weights the reference plan put on two devices can run nowhere: one line
    naming it. A reference plan without the program beside it, or made for another program: one line."""
    from dataclasses import replace

    from kernelfleet.costs.table import CostTable
    from kernelfleet.plan.model import weights_kept

    costs = CostTable.from_json((RECORDED / "profile.costs.json").read_text())
    named = {b.name: b.id for b in program.buffers if b.role == "weight"}
    k = named["model.model.layers.0.self_attn.k_proj.weight"]
    readers = {name: next(x.index for x in program.launches if any(a.buffer == named[name] for a in x.accesses))
               for name in ("model.model.layers.0.self_attn.q_proj.weight", "model.model.layers.0.self_attn.k_proj.weight")}
    first, second = readers.values()
    split = Plan("split", ["b" if i == second else "a" for i in range(len(program.launches))], 1.0)
    kept = weights_kept(costs, program, program, split, "ref.json")
    assert kept.seconds[second] == {"a": None, "b": costs.seconds[second]["b"]}  # k_proj's reader only where k is
    assert kept.seconds[first]["b"] is None and kept.seconds[first]["a"] == costs.seconds[first]["a"]
    reads_both = replace(program.launches[first], accesses=(*program.launches[first].accesses,
                                                           *(a for a in program.launches[second].accesses
                                                             if a.buffer == k)))
    fused = replace(program, launches=[reads_both if x.index == first else x for x in program.launches])
    with pytest.raises(UsageError, match=rf"ref.json: launch {first} \(.*\) reads .*k_proj.*q_proj.*, which the plan "
                                         "keeps on different devices"):
        weights_kept(costs, fused, program, split, "ref.json")
    program.save(tmp_path / "program.json")
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(tmp_path / "program.json"),
                           str(RECORDED / "profile.costs.json"), "--weights-like", str(tmp_path / "nowhere" / "p.json")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and done.stderr.strip().endswith("no program.json beside it (kernelfleet plan --policy "
                                                                 "all --out writes the plans with their program)")
    Plan("short", ["a"], 1.0).save(tmp_path / "short.json")
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(tmp_path / "program.json"),
                           str(RECORDED / "profile.costs.json"), "--weights-like", str(tmp_path / "short.json")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "a plan of 1 launches" in done.stderr and "not its plan" in done.stderr


def test_state_home_on_a_step_without_state_is_one_line(tmp_path):
    stateless = Program.load(PAIRS / "dit-denoise.same" / "program.json.gz")
    stateless.save(tmp_path / "program.json")
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(tmp_path / "program.json"),
                           str(PAIRS / "dit-denoise.same" / "costs.json"), "--device", "a",
                           "--device", "b", "--state-home"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("it is not a step a server carries state across (profile hf:DIR,serve-decode,...)")


def test_keep_home_leaves_out_the_plans_that_move_the_step_off_home(program, tmp_path):
    from kernelfleet.plan import command
    from kernelfleet.plan.baselines import baselines

    state_home(program).save(tmp_path / "program.json")
    made = [command.setup(tmp_path / "program.json", RECORDED / "profile.costs.json", ["a", "b"], [], 25.0, [], [],
                          keep_home=keep).problem for keep in (True, False)]
    plans, skipped = baselines(made[0])
    assert {"single:b", "replicas"} <= set(skipped) and "--keep-home" in skipped["single:b"]
    assert "single:a" in {p.policy for p in plans} and all((p.details.home or "a") == "a" for p in plans)
    assert {p.policy for p in baselines(made[1])[0]} >= {"single:b", "replicas"}  # without it, both are candidates


def test_the_weights_a_device_reads_are_those_its_launches_read_in_any_plan(tmp_path):
    """On the recorded capture of the step (its program and named regions): with layer 1's MLP
    launches on b in one policy's plan and its attention output projection on b in the other's, b
    reads exactly those weights; a device no plan uses reads none."""
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.raw import RawCapture
    from kernelfleet.plan.model import Plan

    raw = RawCapture.load(RECORDED / "disagg.a.capture.json.gz")
    program = assemble(raw)
    named = {b.id: b.name for b in program.buffers if b.role == "weight"}

    def reading(prefix: str) -> list[int]:
        return [x.index for x in program.launches
                if any(named.get(a.buffer, "").startswith(f"model.model.layers.1.{prefix}") for a in x.accesses)]

    def plan(on_b: list[int]) -> Plan:
        return Plan(policy="test", assignment=["b" if i in on_b else "a" for i in range(len(program.launches))],
                    objective_seconds=1.0)

    mlp, o_proj = reading("mlp."), reading("self_attn.o_proj")
    assert mlp and o_proj
    found = {1: {"latency": (Path("l.json"), plan(mlp)), "throughput": (Path("t.json"), plan(o_proj))}}
    captures = {1: program}
    want = {f"model.layers.1.{p}.weight" for p in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                                                   "self_attn.o_proj")}
    assert weights_read(found, captures, "b", WEIGHTS_PREFIX) == want
    assert weights_read(found, captures, "c", WEIGHTS_PREFIX) == set()
    # a runs layer 1's MLP in one plan and its o_proj in the other: it reads every weight the step reads
    read_anywhere = {name.removeprefix(WEIGHTS_PREFIX) for buffer, name in named.items()
                     if any(a.buffer == buffer and a.reads for x in program.launches for a in x.accesses)}
    assert weights_read(found, captures, "a", WEIGHTS_PREFIX) == read_anywhere > want
    # the names are the model's own: the recorded step's model (bench.place_pairs' config), built
    # holding just b's, holds exactly the bytes the capture's regions of them span
    import torch
    from transformers import LlamaConfig

    from bench.place_pairs import SIZES
    from kernelfleet.serve.parts import build_reading

    folder = tmp_path / "llama"
    LlamaConfig(intermediate_size=688, **SIZES).save_pretrained(folder)
    _, held = build_reading(f"hf:{folder}", want, "cpu", 0, torch.bfloat16)
    assert held == sum(r.size_bytes for r in raw.regions if r.name and r.name.removeprefix(WEIGHTS_PREFIX) in want)


def test_captures_over_one_cache_save_its_bytes_once():
    """``replay.written_spans`` over the recorded decode step's program twice (two buckets' captures
    writing the same cache) is the program's own spans: the server saves its state once, not once a
    capture; a second program at other addresses adds its own."""
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.cuda.replay import written_spans
    from kernelfleet.kernels.ir import Buffer
    from kernelfleet.kernels.raw import RawCapture

    program = assemble(RawCapture.load(RECORDED / "disagg.a.capture.json.gz"))
    once = written_spans([program])
    names = {b.id: b.name for b in program.buffers}
    cache = next(b for b in program.buffers if names[b.id] == "cache_1_keys")
    assert any(start <= cache.address and cache.address + cache.size_bytes <= end for start, end in once)
    assert written_spans([program, program]) == once
    assert all(a[1] <= b[0] for a, b in pairwise(once))  # sorted, apart
    moved = Program([Buffer(b.id, b.device, b.address + (1 << 40), b.size_bytes, b.role, b.name)
                     for b in program.buffers], program.launches)
    both = written_spans([program, moved])
    assert len(both) == 2 * len(once) and sum(e - s for s, e in both) == 2 * sum(e - s for s, e in once)


def test_a_throughput_plan_whose_step_is_slower_than_the_latency_plans_is_named(tmp_path):
    """The server runs one batch a step, so a step costs its plan's latency. On the recorded H200
    step the planner's throughput plan is predicted at 287 µs a step against the latency plan's 257:
    the server names the bucket at start. Two copies of the latency plan are not named."""
    slower = slower_under_load(read(recorded(tmp_path / "as-planned"), [1, 2]))
    assert [(size, round(wide * 1e6), round(fast * 1e6)) for size, wide, fast in slower] == [(1, 287, 257),
                                                                                              (2, 287, 257)]
    same = recorded(tmp_path / "same", throughput="latency-greedy")
    assert slower_under_load(read(same, [1, 2])) == []
