"""``kernelfleet plan-serve`` (``serve/plan_buckets.py``): per batch bucket, the profile and plan
commands docs/serve.md gives, resumable, one share on request, kept folders made for other settings
refused; a failing command is one line naming its log, and every bad flag is one line before
anything runs. The commands need a GPU: here a recorder stands in for them (what each writes, as
kernelfleet writes it), and the real command runs on the CPU to its one-line refusal."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from recorded import free_port

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.serve import plan_buckets
from kernelfleet.serve.plan_buckets import Buckets

pytestmark = pytest.mark.unit


def recorder(ran: list[list[str]]):
    """A runner that records each command and writes what kernelfleet's would: the profile's program
    and costs, the plans (the throughput plan saying what it was made for) and their program."""

    def run(args: list[str], log: Path) -> None:
        ran.append(args)
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if args[0] == "profile":
            names = ["program", "costs"]
        else:
            names = ["latency-greedy", "throughput-milp", "single-a", "program"]
        flight = int(args[args.index("--in-flight") + 1]) if "--in-flight" in args else None
        for name in names:
            details = {"in_flight": {"requests": flight}} if flight and name == "throughput-milp" else {}
            (out / f"{name}.json").write_text(json.dumps({"made by": args[0], "details": details}))

    return run


def spec(tmp_path: Path, **changes) -> Buckets:
    settings = dict(model=tmp_path / "model", slots=8, context=2048, profiles=["a:64", "b:32"],
                    devices=["a", "b"], plans=tmp_path / "plans", work=tmp_path / "work", trials=3, time_limit=20.0)
    return Buckets(**{**settings, **changes})


def test_each_bucket_is_profiled_then_planned_for_one_batch_a_step_and_kept(tmp_path):
    ran: list[list[str]] = []
    steps: list[int] = []
    made = plan_buckets.make(spec(tmp_path), said=lambda line: None, advance=lambda: steps.append(1),
                             run=recorder(ran))
    assert made == [1, 2, 4, 8] and len(steps) == 4
    model, work, plans = tmp_path / "model", tmp_path / "work", tmp_path / "plans"
    assert [args[:2] for args in ran] == [
        pair for b in (1, 2, 4, 8) for pair in
        [["profile", f"hf:{model},serve-decode,batch={b},slots=8,context=2048"],
         ["plan", str(work / f"prof-{b}" / "program.json")]]]
    assert ran[0][2:] == ["--profile", "a:64", "--profile", "b:32", "--trials", "3", "--out", str(work / "prof-1")]
    assert ran[1][2:] == [str(work / "prof-1" / "costs.json"), "--device", "a", "--device", "b", "--policy", "all",
                          "--state-home", "--in-flight", "1", "--time-limit", "20", "--out", str(plans / "batch-1")]
    ran.clear()
    lines: list[str] = []
    plan_buckets.make(spec(tmp_path), said=lines.append, run=recorder(ran))
    assert ran == [] and lines == [f"  bucket {b}: plans kept from {plans / f'batch-{b}'}" for b in (1, 2, 4, 8)]
    (plans / "batch-4" / "throughput-milp.json").write_text("{cut short")  # a plan killed mid-write
    plan_buckets.make(spec(tmp_path, time_limit=30.0), said=lambda line: None, run=recorder(ran))
    assert [(args[0], args[-1]) for args in ran] == [("plan", str(plans / "batch-4"))]  # from its kept profile
    ran.clear()
    plan_buckets.make(spec(tmp_path, in_flight=2), said=lambda line: None, run=recorder(ran))
    assert [args[0] for args in ran] == ["plan"] * 4  # made for another number in flight: planned again
    ran.clear()
    (work / "prof-8" / "costs.json").write_text('{"seconds": [')  # a profile killed mid-write
    (plans / "batch-8" / "throughput-milp.json").unlink()
    plan_buckets.make(spec(tmp_path, in_flight=2), said=lambda line: None, run=recorder(ran))
    assert [(args[0], args[-1]) for args in ran] == [("profile", str(work / "prof-8")),
                                                     ("plan", str(plans / "batch-8"))]


def test_one_share_plans_every_bucket_like_the_largest_buckets_first_plan(tmp_path):
    """The largest bucket's share first (its activations take the most memory beside the same cache),
    then every bucket like it; folders made one share before that, from bucket 1's, are refused."""
    ran: list[list[str]] = []
    one_share = spec(tmp_path, slots=2, one_share=True, devices=["a:20", "b:20"])
    plan_buckets.make(one_share, said=lambda line: None, run=recorder(ran))
    work, plans = tmp_path / "work", tmp_path / "plans"
    assert [(args[0], args[-1]) for args in ran] == [
        ("profile", str(work / "prof-2")), ("plan", str(work / "first")),
        ("profile", str(work / "prof-1")), ("plan", str(plans / "batch-1")), ("plan", str(plans / "batch-2"))]
    assert "--weights-like" not in ran[1]
    like = str(work / "first" / "throughput-milp.json")
    for args in (ran[3], ran[4]):
        assert args[args.index("--weights-like") + 1] == like
        assert args[args.index("--device") + 1] == "a:20"
    made = json.loads((plans / "plan-serve.json").read_text())
    del made["weights_of_bucket"]  # as plan-serve wrote it before 2026-12-06's second session
    (plans / "plan-serve.json").write_text(json.dumps(made))
    with pytest.raises(UsageError, match=r"other settings: weights_of_bucket None \(now 2\)"):
        plan_buckets.make(one_share, run=recorder(ran))


def test_a_capped_device_is_planned_at_its_cap_less_the_servers_workspace(tmp_path):
    """The planner gets each capped device's cap less what the server holds beside a plan (its
    workspace, from the model's config: ``reserving``), so the server's start-up check passes what
    the planner placed; a cap the workspace alone fills is one line before anything runs."""
    from transformers import LlamaConfig

    from kernelfleet.serve.memory import FIXED_WORKSPACE_BYTES

    LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(tmp_path / "model")
    assert plan_buckets.reserving(spec(tmp_path)).beside_bytes == 0  # no cap: nothing reserved
    capped = plan_buckets.reserving(spec(tmp_path, slots=2, devices=["a:20", "b:1.5"]))
    per_slot = 1000 * (2 + 4) + 2048  # a row of bf16 and float32 logits, and of the mask (memory.Footprint)
    assert capped.beside_bytes == FIXED_WORKSPACE_BYTES + 2 * per_slot
    left = 20 - capped.beside_bytes / 1e9, 1.5 - capped.beside_bytes / 1e9
    assert capped.planned_devices() == [f"a:{left[0]:.3f}", f"b:{left[1]:.3f}"] == ["a:18.926", "b:0.426"]
    ran: list[list[str]] = []
    plan_buckets.make(capped, said=lambda line: None, run=recorder(ran))
    planned = [args for args in ran if args[0] == "plan"]
    assert planned and all(args[3:7] == ["--device", "a:18.926", "--device", "b:0.426"] for args in planned)
    assert json.loads((tmp_path / "plans" / "plan-serve.json").read_text())["planned_devices"] == ["a:18.926",
                                                                                                "b:0.426"]
    with pytest.raises(UsageError) as found:
        plan_buckets.make(replace(capped, devices=["a:20", "b:1"], plans=tmp_path / "other"), run=recorder(ran))
    assert str(found.value) == ("--device b:1: the server's workspace for 2 slots (1.07 GB) leaves nothing of it for "
                                "the plans")


def test_folders_made_for_other_settings_are_refused_before_anything_runs(tmp_path):
    ran: list[list[str]] = []
    plan_buckets.make(spec(tmp_path, slots=1), said=lambda line: None, run=recorder(ran))
    ran.clear()
    with pytest.raises(UsageError) as found:
        plan_buckets.make(spec(tmp_path, slots=1, context=4096, profiles=["a:64", "b:56"]), run=recorder(ran))
    assert str(found.value) == (f"{tmp_path / 'plans'} holds plans made for other settings: context 2048 (now 4096), "
                                "profiles ['a:64', 'b:32'] (now ['a:64', 'b:56']); give another --out (--work) or "
                                "remove it")
    (tmp_path / "work" / "plan-serve.json").write_text("[1, 2")
    with pytest.raises(UsageError, match="plan-serve.json: not what kernelfleet plan-serve writes"):
        plan_buckets.make(spec(tmp_path, slots=1, plans=tmp_path / "other"), run=recorder(ran))
    assert ran == []
    for bad in (dict(slots=0), dict(context=1), dict(trials=0), dict(time_limit=float("nan"))):
        with pytest.raises(UsageError, match="^--slots must be at least 1"):
            plan_buckets.make(spec(tmp_path / "fresh", **bad), run=recorder(ran))


def test_a_command_that_fails_is_one_line_naming_its_log(tmp_path):
    """The real runner on the CPU: kernelfleet profile refuses to profile without a GPU, and
    plan-serve stops with that line and where the whole output is."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(EnvironmentProblem) as found:
        plan_buckets.make(spec(tmp_path, slots=1), said=lambda line: None)
    log = tmp_path / "work" / "plan-serve.log"
    assert str(found.value).startswith(f"kernelfleet profile hf:{tmp_path / 'model'},serve-decode,batch=1")
    assert "runs on an NVIDIA GPU and none is visible here" in str(found.value) and f"({log} has its output)" in str(
        found.value)
    assert log.read_text().startswith("$ kernelfleet profile hf:")


def kf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelfleet", "plan-serve", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, needle", [
    (["mymodel:make", "--profile", "a:64", "--profile", "b:32"], "TARGET must be hf:DIR"),
    (["hf:{model},decode", "--profile", "a:64", "--profile", "b:32"], "TARGET must be hf:DIR"),
    (["hf:{model}/none", "--profile", "a:64", "--profile", "b:32"], "TARGET must be hf:DIR"),
    (["hf:{model}", "--profile", "a:64"], "--profile must name two or more devices"),
    (["hf:{model}", "--profile", "a:64", "--profile", "b:x"], "expected NAME[:SMS[+HOG]][@GPU]"),
    (["hf:{model}", "--profile", "a:64", "--profile", "a:32"], "--profile must name two or more devices"),
    (["hf:{model}", "--profile", "a:64", "--profile", "b:32", "--device", "a", "--device", "c"],
     "got profiles a, b and devices a, c"),
    (["hf:{model}", "--profile", "a:64", "--profile", "b:32", "--in-flight", "0"], "--in-flight must be within 1"),
    (["hf:{model}", "--profile", "a:64", "--profile", "b:32", "--slots", "0"], "--slots must be at least 1"),
    (["hf:{model}", "--profile", "a:64", "--profile", "b:32"], "making serve plans runs on an NVIDIA GPU"),
])
def test_every_mistake_is_one_line_and_nothing_is_made(tmp_path, args, needle):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    done = kf(*[a.format(model=model) for a in args], "--out", str(tmp_path / "plans"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and needle in lines[0], done.stderr
    assert not (tmp_path / "plans").exists()


def test_the_serve_command_names_each_profile_on_its_gpu():
    assert [plan_buckets.on_gpu(p) for p in ("a:64", "b:32/math-attention", "b:56@1", "c:32+64@1/math-attention")] == [
        "a:64@0", "b:32@0/math-attention", "b:56@1", "c:32+64@1/math-attention"]


MANIFEST_CORPUS = [b"[1", b"[]", b"{}", b'"x"', b"\xff\xfe{", *(
    b'{"model": "/m", "slots": %s, "context": %s, "profiles": %s, "devices": [], "one_share": %s}' % fields
    for fields in [(b'"2"', b"64", b"[]", b"false"), (b"2", b"64", b"[1]", b"false"), (b"2", b"64.0", b"[]", b"false"),
                   (b"true", b"64", b"[]", b"false"), (b"2", b"64", b"[]", b"0")])]


@pytest.mark.parametrize("text", MANIFEST_CORPUS)
def test_a_hostile_manifest_is_one_line_naming_it(tmp_path, text):
    (tmp_path / "plan-serve.json").write_bytes(text)
    with pytest.raises(UsageError, match=r"plan-serve.json: not what kernelfleet plan-serve writes"):
        plan_buckets.made_for(tmp_path)


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelfleet", "serve", *args, "--listen", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=120)


def test_serve_takes_a_plan_serve_folders_profiles_and_context_and_refuses_other_sizes(tmp_path):
    """What plan-serve made a folder for: serve takes its profiles and context where not given, and
    refuses other slots or context in one line before anything loads (the buckets' captures would
    differ from the plans' programs)."""
    model, plans = tmp_path / "model", tmp_path / "plans"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
                                                   "intermediate_size": 128, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                                   "max_position_embeddings": 256}))
    plan_buckets.make(spec(tmp_path, model=model, slots=2, context=64), said=lambda line: None, run=recorder([]))
    for flags, needle in ((["--context", "128"], "not --context 128"), (["--slots", "4"], "not --slots 4"),
                          (["--slots", "4", "--context", "32"], "not --slots 4 and --context 32")):
        done = serve(f"hf:{model}", "--plans", str(plans), *flags)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0] == (f"kernelfleet: error: --plans {plans} was made for 2 slots of 64 tokens (kernelfleet "
                            f"plan-serve), {needle}: serve it with those, or make plans for these")
    # without --profile: the folder's, so the server gets as far as reading the plans (the recorder's are not plans)
    done = serve(f"hf:{model}", "--plans", str(plans))
    assert done.returncode != 0 and "Traceback" not in done.stderr and "--profile go together" not in done.stderr
    assert str(plans / "batch-1") in done.stderr, done.stderr


def test_profiles_take_the_step_once_where_twice_cannot_fit_and_are_refused_where_once_cannot(tmp_path):
    """The 8B's sizes: each profile holds the step twice (for its whole-step graphs), so two profiles
    on one GPU hold it four times: about 73 GB at 8 slots of 2,048 tokens (the seventh run's, which an
    H100 held), about 133 GB at 64. Plans for one request in flight never use the second copy (the
    free-slot speedup), so at 64 slots they are profiled with one (about 67 GB); plans for two in
    flight need both, and 128 slots do not fit even once; each refused in one line before anything runs."""
    from kernelfleet.serve.memory import Footprint, kv_bytes

    eight_b = Footprint(weights_bytes=16_060_522_496, kv_bytes_per_slot=kv_bytes(32, 8, 128, 2048, 2),
                        workspace_bytes_per_slot=128256 * 6 + 2048)
    h100 = lambda gpu: 84_000_000_000  # noqa: E731 -- free bytes on every GPU
    assert plan_buckets.profile_bytes(spec(tmp_path), eight_b, 2)[0] / 1e9 == pytest.approx(72.9, abs=0.1)
    assert plan_buckets.graph_copies(spec(tmp_path), eight_b, h100) == 2
    wide = spec(tmp_path, slots=64)
    assert plan_buckets.profile_bytes(wide, eight_b, 1)[0] / 1e9 == pytest.approx(66.6, abs=0.1)
    assert plan_buckets.graph_copies(wide, eight_b, h100) == 1
    with pytest.raises(UsageError) as found:
        plan_buckets.graph_copies(spec(tmp_path, slots=64, in_flight=2), eight_b, h100)
    assert str(found.value) == ("each bucket's profile holds the step twice a profile (for its whole-step graphs): "
                                "about 133.2 GB on GPU 0 for 64 slots of 2048 tokens, which has 84.0 GB free; give "
                                "fewer --slots or a shorter --context")
    with pytest.raises(UsageError, match="^each bucket's profile holds the step once a profile .* about 101.0 GB on "
                                         "GPU 0 for 128 slots"):
        plan_buckets.graph_copies(spec(tmp_path, slots=128), eight_b, h100)
    apart = plan_buckets.profile_bytes(spec(tmp_path, profiles=["a:64", "b:56@1"]), eight_b, 2)  # a GPU each
    together = plan_buckets.profile_bytes(spec(tmp_path), eight_b, 2)[0]
    assert apart == {0: together // 2, 1: together // 2}
    ran: list[list[str]] = []
    plan_buckets.make(spec(tmp_path, slots=1, graph_copies=1), said=lambda line: None, run=recorder(ran))
    assert ran[0][ran[0].index("--graph-copies") + 1] == "1" and "--graph-copies" not in ran[1]
    # every profile kept: nothing is profiled, so no GPU is asked (there is none here)
    assert plan_buckets.on_this_gpu(spec(tmp_path, slots=1), print) == spec(tmp_path, slots=1)


def test_profile_takes_one_or_two_graph_copies():
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "profile", "llama8b-decode", "--graph-copies", "3"],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--graph-copies 1 or 2, got 5, 0 and 3" in lines[0], done.stderr
