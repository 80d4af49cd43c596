"""``bench.serve_gpu``'s control flow on the CPU (``--cpu --quick``, tiny models): every case's
server starts, the batch-1 table and the loads run, every request gets its tokens, the capped
pair's three ways (replicas, pipeline, split) run with the slots they set and are compared, once a
prefill setting (``--prefill-chunk`` and ``--prefill-batch`` values that combine) and side by side;
the trace it wrote replays; a bad trace file, chunk or batch list is one line."""

import csv
import dataclasses
from pathlib import Path

import pytest
from recorded import bench_quick, bench_refused, free_port, tiny_causal_lm

pytestmark = pytest.mark.unit


def test_the_dry_run_serves_every_load_and_reports_it(tmp_path):
    table, report = bench_quick("serve_gpu", args=("--cpu", "--out", str(tmp_path), "--cases", "llama8b,capped",
                                                    "--requests", "3", "--prefill-chunk", "0,8",
                                                    "--prefill-batch", "1,4"))
    assert table.startswith("command: ") and "highest rate held at p99 TPOT <= 50 ms" in table
    llama, _, pipeline = report["cases"][:3]
    # every case once a setting; a chunk of 8 with a batch of 4 does not combine
    settings = [(0, 1), (0, 4), (8, 1)]
    assert [(case["name"], case["prefill_chunk_tokens"], case["prefill_batch"], case["slots"])
            for case in report["cases"]] == [
        (name, chunk, batch, slots) for chunk, batch in settings
        for name, slots in [("llama8b", 4), ("capped-replicas", 2), ("capped-pipeline", 4), ("capped-split", 2)]]
    assert all(case["flags"][-4:] == ["--prefill-chunk", str(case["prefill_chunk_tokens"]), "--prefill-batch",
                                      str(case["prefill_batch"])] for case in report["cases"])
    assert llama["overhead"]["bare_ms_per_token"] > 0 and pipeline["overhead"] is None
    assert [(pair["prefill_chunk_tokens"], pair["prefill_batch"]) for pair in report["capped_pairs"]] == settings
    assert all((pair["replicas_slots"], pair["pipeline_slots"], pair["split_slots"]) == (2, 4, 2)
               and pair["split_tokens_per_second"] > 0 for pair in report["capped_pairs"])
    assert "\nsplit " in table  # the split's row beside the pair's
    assert "pipeline / replicas: " in table and "(target >= 2x)" in table
    assert " chunk  batch  replicas  pipeline  ratio" in table  # the settings side by side
    for case in report["cases"]:
        assert [load["requests"] for load in case["poisson"]] == [3] * len(case["poisson"])
        assert all(load["output_tokens"] >= 3 and load["tokens_per_second"] > 0 for load in case["poisson"])
        assert all(load["plan_steps"] is None for load in [*case["poisson"], case["trace"]])  # no plans served
    with (tmp_path / "trace.csv").open() as file:
        written = list(csv.DictReader(file))
    assert report["cases"][0]["trace"]["requests"] == len(written) == 6
    assert (tmp_path / "serve_gpu.json").is_file() and (tmp_path / "server-capped-pipeline-chunk8-batch1.log").is_file()


@pytest.mark.parametrize("flags, said", [
    (["--prefill-chunk", "0,x"], ("bench.serve_gpu: --prefill-chunk takes distinct whole numbers of tokens (0: whole "
     "prompts), comma-separated, got '0,x'")),
    (["--prefill-batch", "0"], ("bench.serve_gpu: --prefill-batch takes distinct whole numbers of prompts (1 or more), "
     "comma-separated, got '0'")),
    (["--prefill-chunk", "8", "--prefill-batch", "4"], ("bench.serve_gpu: --prefill-chunk 8 and --prefill-batch 4 leave "
     "no setting the server takes (a chunk goes with a batch of 1)")),
    (["--cases", "plans"], ("bench.serve_gpu: the plans cases need a GPU (kernelfleet profile and serve --plans capture "
     "CUDA graphs); --cpu runs the other cases")),
    (["--plan-seconds", "0"], ("bench.serve_gpu: --plan-trials must be at least 1, --plan-seconds within (0, 3600), "
     "--plan-in-flight within 0 to 256 and --plan-slots and --capped-plan-slots within 1 to 64, got 3, 0, 1, 8 and "
     "32")),
    (["--plan-in-flight", "-1"], ("bench.serve_gpu: --plan-trials must be at least 1, --plan-seconds within (0, 3600), "
     "--plan-in-flight within 0 to 256 and --plan-slots and --capped-plan-slots within 1 to 64, got 3, 60, -1, 8 "
     "and 32")),
    (["--plan-slots", "65"], ("bench.serve_gpu: --plan-trials must be at least 1, --plan-seconds within (0, 3600), "
     "--plan-in-flight within 0 to 256 and --plan-slots and --capped-plan-slots within 1 to 64, got 3, 60, 1, 65 "
     "and 32")),
    (["--second-gpu", "1"], "bench.serve_gpu: --second-gpu 1: not a GPU this machine has (0 GPUs)"),
    (["--capped-plan-slots", "0"], ("bench.serve_gpu: --plan-trials must be at least 1, --plan-seconds within (0, "
     "3600), --plan-in-flight within 0 to 256 and --plan-slots and --capped-plan-slots within 1 to 64, got 3, 60, 1, "
     "8 and 0"))])
def test_a_bad_flag_or_a_gpu_only_case_is_one_line(tmp_path, flags, said):
    assert bench_refused("serve_gpu", tmp_path, *flags) == said


def test_a_bad_trace_file_is_one_line(tmp_path):
    bad = tmp_path / "trace.csv"
    bad.write_text("arrival_seconds,prompt_tokens,output_tokens\n0.5,12,x\n")
    assert bench_refused("serve_gpu", tmp_path / "out", "--trace", str(bad)) == (
        f"bench.serve_gpu: --trace {bad} line 2: expected arrival_seconds,prompt_tokens,output_tokens (a number, two "
        "whole numbers), got {'arrival_seconds': '0.5', 'prompt_tokens': '12', 'output_tokens': 'x'}")


def recorder(ran: list[list[str]]):
    """A stand-in for the kernelfleet commands (they need a GPU): each call recorded in ``ran``, and
    what kernelfleet writes left behind."""
    def kernelfleet(args: list[str], log: Path) -> None:
        ran.append(args)
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        names = ["program", "costs"] if args[0] == "profile" else ["latency-greedy", "throughput-milp", "single-a",
                                                                   "program"]
        flight = int(args[args.index("--in-flight") + 1]) if "--in-flight" in args else None
        for name in names:
            details = (f', "details": {{"in_flight": {{"requests": {flight}}}}}'
                       if flight and name == "throughput-milp" else "")
            (out / f"{name}.json").write_text(f'{{"made by": "{args[0]}", "name": "{name}"{details}}}')
    return kernelfleet


def test_the_plans_are_made_per_bucket_by_the_users_commands_and_kept_for_the_next_run(tmp_path):
    """``bench.serve_plans.prepare`` with the commands recorded instead of run (they need a GPU):
    profile then plan --state-home per bucket of the server's slots, each writing what kernelfleet
    writes; a second run makes nothing again; the home-alone folder serves single-a for both policies,
    beside the plans' program."""
    from bench import serve_plans

    ran: list[list[str]] = []
    kernelfleet = recorder(ran)
    model = tmp_path / "model"
    plans, alone = serve_plans.prepare(model, tmp_path, 2048, 3, run=kernelfleet, milp_seconds=15)
    assert [(args[0], args[1]) for args in ran] == [
        (command, first) for bucket in (1, 2, 4, 8) for command, first in
        [("profile", f"hf:{model},serve-decode,batch={bucket},slots=8,context=2048"),
         ("plan", str(tmp_path / f"prof-{bucket}" / "program.json"))]]
    planned = [args for args in ran if args[0] == "plan"]
    assert [args[args.index("--out") + 1] for args in planned] == [str(plans / f"batch-{b}") for b in (1, 2, 4, 8)]
    assert all("--state-home" in args and args[args.index("--time-limit") + 1] == "15" for args in planned)
    assert all(args[args.index("--in-flight") + 1] == "1" for args in planned)  # the server runs one batch a step
    assert ran[0][2:] == ["--profile", "a:64", "--profile", "b:56", "--trials", "3", "--out", str(tmp_path / "prof-1")]
    for bucket in (1, 2, 4, 8):
        for policy in ("latency-greedy", "throughput-milp"):
            assert '"name": "single-a"' in (alone / f"batch-{bucket}" / f"{policy}.json").read_text()
        assert '"made by": "plan"' in (alone / f"batch-{bucket}" / "program.json").read_text()  # the plans' program
    ran.clear()
    serve_plans.prepare(model, tmp_path, 2048, 3, run=kernelfleet)
    assert ran == []  # kept
    serve_plans.prepare(model, tmp_path, 2048, 3, run=kernelfleet, in_flight=None)  # plans for many in flight
    assert [args[0] for args in ran] == ["plan"] * 4  # made again, each from its kept profile
    assert not any("--in-flight" in args for args in ran)
    ran.clear()
    serve_plans.prepare(model, tmp_path, 2048, 3, run=kernelfleet, in_flight=None)
    assert ran == []
    (plans / "batch-2" / "throughput-milp.json").write_text("{cut short")  # a call killed mid-write
    serve_plans.prepare(model, tmp_path, 2048, 3, run=kernelfleet, in_flight=None)
    assert [(args[0], args[-1]) for args in ran] == [("plan", str(plans / "batch-2"))]
    assert serve_plans.served_flags(plans) == ["--plans", str(plans), "--profile", "a:64@0", "--profile", "b:56@0",
                                               "--slots", "8", "--shortest-context", "128"]
    # --plan-slots, with the GPU's room (here: one copy a profile) deciding how profile runs
    ran.clear()
    wide = tmp_path / "wide"
    serve_plans.prepare(model, wide, 2048, 3, run=kernelfleet, slots=16,
                        room=lambda spec: dataclasses.replace(spec, graph_copies=1))
    profiled = [args for args in ran if args[0] == "profile"]
    assert [args[1] for args in profiled] == [f"hf:{model},serve-decode,batch={b},slots=16,context=2048"
                                              for b in (1, 2, 4, 8, 16)]
    assert all(args[args.index("--graph-copies") + 1] == "1" for args in profiled)
    assert serve_plans.served_flags(wide / "plans", 16)[-4:-2] == ["--slots", "16"]


def test_the_capped_pairs_plans_hold_each_device_to_its_cap_with_one_share_of_the_weights(tmp_path):
    """``capped-plans``: every plan is made with each device held to 20 GB less the server's workspace
    (as the benchmark sizes it, ``plan_buckets.reserving``: here a tiny Llama's), the largest bucket's
    share of the weights first and every bucket's plans like it (plan-serve --one-share), at 32 slots;
    the server is held to the 20 GB caps, and no home-alone twin is made. On the CPU the case is
    refused in one line, as the plans cases are."""
    from bench import serve_plans
    from bench.serve_gpu import CAPPED_PLAN_SLOTS
    from kernelfleet.serve.plan_buckets import reserving

    tiny_causal_lm("llama").config.save_pretrained(tmp_path / "model")
    ran: list[list[str]] = []
    plans, alone = serve_plans.prepare(tmp_path / "model", tmp_path, 2048, 3, run=recorder(ran), milp_seconds=15,
                                       slots=CAPPED_PLAN_SLOTS, capped=True, room=reserving)
    assert alone is None and not (tmp_path / "plans-a").exists()
    planned = [args for args in ran if args[0] == "plan"]
    assert [args[1] for args in ran if args[0] == "profile"] == [
        f"hf:{tmp_path / 'model'},serve-decode,batch={b},slots=32,context=2048" for b in (32, 1, 2, 4, 8, 16)]
    assert all(args[3:7] == ["--device", "a:18.926", "--device", "b:18.926"] for args in planned), planned[0]
    assert all("--weights-like" in args for args in planned[1:])  # the largest bucket's share, then all like it
    assert serve_plans.served_flags(plans, CAPPED_PLAN_SLOTS, capped=True) == [
        "--plans", str(plans), "--profile", "a@0", "--profile", "b@0", "--device", "a:20", "--device", "b:20",
        "--slots", "32", "--shortest-context", "128"]
    # the pair's devices, as its other strategies have them: the whole GPU each, held to 20 GB
    assert all(args[2:6] == ["--profile", "a", "--profile", "b"] for args in ran if args[0] == "profile")
    assert bench_refused("serve_gpu", tmp_path, "--cases", "capped-plans") == (
        "bench.serve_gpu: the plans cases need a GPU (kernelfleet profile and serve --plans capture CUDA graphs); "
        "--cpu runs the other cases")


def test_the_moe_runs_every_strategy_with_the_8bs_devices_and_flags(tmp_path):
    """``--cases moe-strategies``: request distribution, the split and the pipeline with the MoE, on
    the devices and flags of the 8B's cases; the pipeline's (layers cut over two devices, each with
    its experts) served for real on the CPU."""
    from bench.serve_gpu import CPU_CASES, GPU_CASES, GROUPS, MOE, TINY_MOE

    for cases, config in ((GPU_CASES, MOE), (CPU_CASES, TINY_MOE)):
        found = {case.name: case for case in cases}
        for name in GROUPS["moe-strategies"]:
            moe, dense = found[name], found[name.removeprefix("moe-")]
            assert moe.config == config and moe.flags == dense.flags and moe.rates_per_second == dense.rates_per_second
    _, report = bench_quick("serve_gpu", args=("--cpu", "--out", str(tmp_path), "--cases", "moe-pipeline",
                                               "--requests", "2"))
    (case,) = report["cases"]
    assert case["name"] == "moe-pipeline" and all(load["requests"] == 2 for load in case["poisson"])


def test_the_strategies_caps_shrink_in_proportion_to_a_card_smaller_than_an_h200():
    """The strategies' caps on GPU 0 are an H200's (60 + 60 GB): on an H100's 85 GB they add up to
    more than it holds, and the server refuses them; ``on_card`` scales them to 94 % of the card, in
    proportion, and leaves caps that fit, and those on another GPU, as they are."""
    from bench.serve_gpu import GPU_CASES, Case, on_card

    found = {case.name: case for case in GPU_CASES}
    h100, h200 = 85_000_000_000, 150_000_000_000
    assert on_card(found["moe-replicas"], h100).flags == ("--strategy", "replicas", "--device", "r0:39.5@0",
                                                          "--device", "r1:39.5@0")
    assert on_card(found["split"], h100).flags == ("--strategy", "split", "--device", "pre:18@0", "--device",
                                                   "dec:61@0")
    for name in ("replicas", "split", "pipeline", "capped-replicas", "llama8b"):
        assert on_card(found[name], h200) == found[name]
    assert on_card(found["capped-pipeline"], h100) == found["capped-pipeline"]  # 40 GB fit
    apart = Case("apart", {}, 8, ("--device", "a:60@0", "--device", "b:60@1"), (1.0,))
    assert on_card(apart, h100) == apart


def test_the_plans_cases_serve_the_model_their_plans_were_made_for(tmp_path):
    """``--plans-model``: each case's config is the model's, and a plans folder made for one model is
    refused for another (its kept plans are the first model's), in one line naming the folder."""
    import json

    from bench.serve_gpu import LLAMA8B, MOE, plans_cases, plans_model_dir

    plans, alone = tmp_path / "plans", tmp_path / "plans-a"
    assert [c.config for c in plans_cases(plans, alone, "moe")] == [MOE] * 3
    assert [c.config for c in plans_cases(plans, alone)] == [LLAMA8B] * 3
    model = plans_model_dir(tmp_path, "moe")
    assert json.loads((model / "config.json").read_text())["model_type"] == "qwen2_moe"
    assert plans_model_dir(tmp_path, "moe") == model  # the same model again: kept
    with pytest.raises(SystemExit, match=f"^bench.serve_gpu: {tmp_path} holds plans for another model than "
                                         "--plans-model llama8b"):
        plans_model_dir(tmp_path, "llama8b")


def test_the_plans_rows_compare_each_server_at_its_best_held_load():
    from bench.serve_gpu import CaseResult, Load, plans_rows

    def case(name: str, tokens: list[float], p99: list[float]) -> CaseResult:
        loads = [Load(load=f"poisson {k}/s", requests=8, output_tokens=100, seconds=1.0, tokens_per_second=t,
                      ttft_p50_ms=1, ttft_p99_ms=1, tpot_p50_ms=1, tpot_p99_ms=p) for k, (t, p) in enumerate(zip(tokens, p99))]
        return CaseResult(name=name, prefill_chunk_tokens=0, prefill_batch=8, flags=[], slots=8, context_tokens=2048,
                          startup_seconds=1.0, overhead=None, poisson=loads[:-1], trace=loads[-1],
                          max_rate_at_p99_tpot_50ms=None)

    results = [case("plans-whole", [400, 800, 500], [20, 40, 30]), case("plans-a", [200, 300, 250], [30, 80, 40]),
               case("plans", [300, 600, 350], [25, 60, 45])]
    (row,) = plans_rows(results, [(0, 8), (0, 1)])  # the second setting did not run
    assert row.model == "llama8b" and plans_rows(results, [(0, 8)], "moe")[0].model == "moe"
    assert row.tokens_per_second == {"plans-whole": 800, "plans-a": 250, "plans": 350}  # held: p99 TPOT <= 50 ms
    assert row.plans_vs_home_alone == pytest.approx(1.4) and row.plans_vs_whole_gpu == pytest.approx(350 / 800)


def test_a_load_on_a_server_over_plans_says_how_many_steps_ran_under_each_plan():
    """The steps counter a placed server exports (``placed.plan_metrics``), served over real HTTP:
    a load records the steps it added under each plan, not the server's totals."""
    from prometheus_client import CollectorRegistry, start_http_server

    from bench.serve_gpu import Load, plan_steps, with_plan_steps
    from kernelfleet.serve.placed import plan_metrics

    registry = CollectorRegistry()
    _, steps = plan_metrics(registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{port}"
        steps.labels(policy="latency").inc(5)  # an earlier load's

        def load() -> Load:
            steps.labels(policy="latency").inc(2)
            steps.labels(policy="throughput").inc(7)
            return Load(load="poisson 4/s", requests=1, output_tokens=9, seconds=1.0, tokens_per_second=9.0,
                        ttft_p50_ms=1, ttft_p99_ms=1, tpot_p50_ms=1, tpot_p99_ms=1)

        assert plan_steps(url) == {"latency": 5.0, "throughput": 0.0}
        assert with_plan_steps(url, load).plan_steps == {"latency": 2.0, "throughput": 7.0}
    finally:
        server.shutdown()
        thread.join()


def test_second_gpu_puts_each_pairs_second_device_on_it_and_the_plans_on_two_whole_gpus(tmp_path):
    """``--second-gpu 1`` (issue 20: the serve benchmark with the devices on separate GPUs): every
    two-device case's second device moves to GPU 1, a one-device case stays, and GPU 0's caps are
    then checked against its own card only; the plans are made and served on the whole of each GPU."""
    from bench import serve_plans
    from bench.serve_gpu import GPU_CASES, on_card, on_gpus

    found = {case.name: case for case in GPU_CASES}
    assert on_gpus(found["capped-split"], 1).flags[-4:] == ("--device", "pre:20@0", "--device", "dec:20@1")
    assert on_gpus(found["moe-pipeline"], 1).flags[-2:] == ("--device", "p1:60@1")
    assert on_gpus(found["llama8b"], 1) == found["llama8b"] and on_gpus(found["replicas"], 0) == found["replicas"]
    h100 = 85e9  # the replicas' 60 + 60 GB do not fit one H100 and are scaled; one on each card they fit
    assert on_card(found["replicas"], h100).flags != found["replicas"].flags
    assert on_card(on_gpus(found["replicas"], 1), h100).flags[-3:] == ("r0:60@0", "--device", "r1:60@1")
    ran: list[list[str]] = []
    plans, _ = serve_plans.prepare(tmp_path / "model", tmp_path, 2048, 3, run=recorder(ran), slots=2,
                                   capped=True, second_gpu=1)
    assert all(args[2:6] == ["--profile", "a", "--profile", "b@1"] for args in ran if args[0] == "profile")
    assert all(args[3:7] == ["--device", "a:20", "--device", "b:20"] for args in ran if args[0] == "plan")
    assert serve_plans.served_flags(plans, 2, True, 1)[2:6] == ["--profile", "a@0", "--profile", "b@1"]
