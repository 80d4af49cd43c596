"""The memory-capped pair on one H100 (2026-12-06, docs/validation/serve-gpu.md, ninth run):
``bash bench/pending_run.sh capped`` (``bench.serve_gpu --cases capped --requests 48``), the 8B served
three ways on two 20 GB devices of GPU 0: request distribution, the layer pipeline and, for the first
time on a GPU, the prefill/decode split. Recorded in ``docs/validation/h100-2026-12-06/serve_gpu_capped.json``.
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
