"""The memory-capped pair on one H100 (2026-12-06, docs/validation/serve-gpu.md, ninth run):
``bash bench/pending_run.sh capped`` (``bench.serve_gpu --cases capped --requests 48``), the 8B served
three ways on two 20 GB devices of GPU 0: request distribution, the layer pipeline and, for the first
time on a GPU, the prefill/decode split. Recorded in ``docs/validation/h100-2026-12-06/serve_gpu_capped.json``.
The tenth run (the session after, ``bash bench/pending_run.sh capped-plans``): the same three and
kernelfleet's plans, with transformers 5.24, in ``docs/validation/h100-2026-12-06-transformers-5.24``.
"""

from pathlib import Path

import pytest

from bench.serve_gpu import TPOT_SLO_SECONDS, Report, held_tokens_per_second

pytestmark = pytest.mark.replay

RUN = Path(__file__).parents[2] / "docs" / "validation" / "h100-2026-12-06" / "serve_gpu_capped.json"


@pytest.fixture(scope="module")
def cases():
    run = Report.model_validate_json(RUN.read_text())
    assert run.device.startswith("NVIDIA H100") and "--cases capped" in run.command
    return {case.name: case for case in run.cases}


def test_three_ways_on_two_20_gb_devices_each_with_the_slots_its_share_of_weights_leaves(cases):
    """The caps fit the H100 as they are (40 of its 80 GB): nothing scaled. Replicas hold all 16 GB of
    weights each (10 slots a replica); the pipeline's stages half each (64); the split's decode device
    all of them (10)."""
    assert list(cases) == ["capped-replicas", "capped-pipeline", "capped-split"]
    for case in cases.values():
        assert [flag for flag in case.flags if flag.endswith("@0")] == [flag for flag in case.flags
                                                                        if flag.endswith(":20@0")]
        assert all(load.requests == 48 for load in case.poisson)
    assert [case.slots for case in cases.values()] == [20, 64, 10]


def test_only_the_split_holds_the_bound_and_the_pipeline_misses_it_by_more_than_twice(cases):
    """The split held 64 requests/s at p99 TPOT 34.5 ms, and its best held load, the trace, at 308.4
    tokens/s (its decode device never prefills); request distribution ran at p99 76-92 ms and the pipeline at 119-123 ms, so the
    issue's target (the pipeline at 2x request distribution at the same p99 TPOT) cannot be read on
    this card: at the same loads the pipeline made 1.37-1.47x request distribution's tokens/s, over the
    bound. On the H200 (2026-12-02, fifth run) the same command held 1,486 tokens/s at p99 30 ms."""
    split, replicas, pipeline = cases["capped-split"], cases["capped-replicas"], cases["capped-pipeline"]
    assert split.max_rate_at_p99_tpot_50ms == 64.0 and round(held_tokens_per_second(split), 1) == 308.4
    assert all(load.tpot_p99_ms < TPOT_SLO_SECONDS * 1e3 for load in (*split.poisson, split.trace))
    for case in (replicas, pipeline):
        assert case.max_rate_at_p99_tpot_50ms is None
        assert all(load.tpot_p99_ms > TPOT_SLO_SECONDS * 1e3 for load in (*case.poisson, case.trace))
    assert min(load.tpot_p99_ms for load in pipeline.poisson) > 2 * TPOT_SLO_SECONDS * 1e3
    ratios = [p.tokens_per_second / r.tokens_per_second for p, r in zip(pipeline.poisson, replicas.poisson)]
    assert [round(x, 2) for x in ratios] == [1.47, 1.37]


def test_the_pipeline_answers_first_tokens_in_a_fraction_of_a_second_where_ten_slot_servers_queue(cases):
    """With 64 slots every request of a rate starts at once (TTFT p50 174 ms at 16/s); the two servers of
    10 slots a device queue them (p50 5.5-5.9 s)."""
    pipeline = cases["capped-pipeline"].poisson[0]
    assert pipeline.ttft_p50_ms < 200
    for name in ("capped-replicas", "capped-split"):
        assert all(load.ttft_p50_ms > 5000 for load in cases[name].poisson)


# the tenth run: the same three and kernelfleet's plans, with transformers 5.24 (the image's repeats every
# layer's keys and values in each decode step), in one call of ``bash bench/pending_run.sh capped-plans``
TENTH = Path(__file__).parents[2] / "docs" / "validation" / "h100-2026-12-06-transformers-5.24"


@pytest.fixture(scope="module")
def tenth():
    run = Report.model_validate_json((TENTH / "serve_gpu_capped_plans.json").read_text())
    assert run.device.startswith("NVIDIA H100") and run.transformers == "5.24.0"
    assert "--cases capped,capped-plans" in run.command
    return run


def test_with_transformers_524_the_pipeline_holds_3x_request_distribution_at_the_bound(tenth, cases):
    """Both held 64 requests/s at p99 TPOT <= 50 ms (the pipeline 30.8 ms, request distribution 47.4):
    1,339 against 443 tokens/s, 3.02x (the issue's target 2x; the H200 made 2.88x). With the image's
    transformers the same strategies ran 1.61x (request distribution) and 3.55x (the pipeline) slower
    at 64/s, neither within the bound."""
    pair = tenth.capped_pairs[0]
    assert (pair.replicas_slots, pair.pipeline_slots) == (20, 64) and round(pair.pipeline_vs_replicas, 2) == 3.02
    now = {case.name: case for case in tenth.cases}
    for name in ("capped-replicas", "capped-pipeline"):
        assert now[name].max_rate_at_p99_tpot_50ms == 64.0 and now[name].poisson[1].tpot_p99_ms < 50
    before = [now[n].poisson[1].tokens_per_second / cases[n].poisson[1].tokens_per_second
              for n in ("capped-replicas", "capped-pipeline")]
    assert [round(x, 2) for x in before] == [1.61, 3.55]


def test_the_capped_plans_server_starts_and_serves_every_request_with_both_plans(tenth):
    """The start-up gate's saved state now on the host, the plans' server started in its caps (42 s)
    and answered every request of every load with the tokens the other servers produced; the monitor
    ran both plans at every load. 746.5 tokens/s held at 64/s (p99 41.5 ms): 1.68x request
    distribution, 0.56x the pipeline, which holds 64 slots where the plans' cache, homed on a, leaves
    room for 32."""
    cases = {case.name: case for case in tenth.cases}
    plans = cases["capped-plans"]
    assert plans.slots == 32 and plans.max_rate_at_p99_tpot_50ms == 64.0
    for k, load in enumerate([*plans.poisson, plans.trace]):
        others = [c.poisson[k] if k < 2 else c.trace for n, c in cases.items() if n != "capped-plans"]
        assert all(load.requests == o.requests and load.output_tokens == o.output_tokens for o in others)
        assert load.plan_steps["latency"] > 0 and load.plan_steps["throughput"] > 0
    pair = tenth.capped_pairs[0]
    assert round(held_tokens_per_second(plans), 1) == round(pair.plans_tokens_per_second, 1) == 746.5
    assert round(pair.plans_tokens_per_second / pair.replicas_tokens_per_second, 2) == 1.68
    assert round(pair.plans_tokens_per_second / pair.pipeline_tokens_per_second, 2) == 0.56


def test_the_gate_saved_state_on_the_host_passed_its_gpu_test():
    assert (TENTH / "test_capture.txt").read_text().split()[-4:-2] == ["3", "passed"]
