"""The server's context buckets on one H100 (2026-12-06, the second session; docs/validation/serve-gpu.md,
eleventh run): ``bash bench/pending_run.sh serve-contexts`` (``python -m bench.serve_contexts``), the 8B's
decode graph at batches 1, 8 and 64 of 64 slots of 2,048 tokens, every context bucket against the whole
context in the same run. Recorded in ``docs/validation/h100-2026-12-06-contexts/serve_contexts.json``."""

from pathlib import Path

import pytest

from bench.serve_contexts import Report

pytestmark = pytest.mark.replay

RUN = Path(__file__).parents[2] / "docs" / "validation" / "h100-2026-12-06-contexts" / "serve_contexts.json"


@pytest.fixture(scope="module")
def run() -> Report:
    report = Report.model_validate_json(RUN.read_text())
    assert report.device.startswith("NVIDIA H100") and "bench.serve_contexts" in report.command
    return report


def rows(run: Report) -> dict[tuple[int, int], float]:
    return {(row.batch, row.context): row.step_ms for row in run.rows}


def test_a_step_attending_fewer_positions_is_faster_at_every_batch(run):
    """At each batch the step time rises with the context bucket, and the 2,048-token bucket is the
    whole-context graph again (within 0.2 %, two captures of one step)."""
    assert run.context_buckets.contexts == [128, 256, 512, 1024, 2048] and run.one_context_bucket.contexts == [2048]
    times = rows(run)
    for batch in (1, 8, 64):
        steps = [times[batch, context] for context in run.context_buckets.contexts]
        assert steps == sorted(steps), batch
        full = next(row for row in run.rows if row.batch == batch and row.context == 2048)
        assert abs(full.whole_context_over_this - 1) < 0.002, batch


def test_what_the_shortest_bucket_buys_grows_with_the_batch(run):
    """At 128 positions: 1.15x at batch 1 (8.59 against 9.89 ms), 1.13x at 8 and 1.52x at 64 (10.48
    against 15.98 ms): the cache a step reads grows with its rows, the weights it reads do not."""
    ratio = {row.batch: round(row.whole_context_over_this, 2) for row in run.rows if row.context == 128}
    assert ratio == {1: 1.15, 8: 1.13, 64: 1.52}


def test_the_context_buckets_cost_seconds_and_under_a_gib_at_start(run):
    """Five times the graphs (35 against 7) in 7.2 against 3.2 s of capture, and 0.75 GiB more
    allocated: the graphs of a batch bucket share one logits tensor (serve/graphs.py)."""
    one, many = run.one_context_bucket, run.context_buckets
    assert (one.graphs, many.graphs) == (7, 35)
    assert round(many.capture_seconds, 1) == 7.2 and round(one.capture_seconds, 1) == 3.2
    assert 0.5 < many.memory_gib - one.memory_gib < 1.0
