"""``bench.serve_contexts``'s control flow on the CPU (``--cpu --quick``, the tiny model): both
builds are reported (one context bucket, then the server's buckets), every batch is timed at every
context bucket against the whole context; its JSON is the table's; a bad flag is one line."""

import pytest
from recorded import bench_quick, bench_refused

pytestmark = pytest.mark.unit


def test_the_dry_run_times_every_batch_at_every_context_bucket(tmp_path):
    table, report = bench_quick("serve_contexts", args=("--cpu", "--out", str(tmp_path)))
    assert table.startswith("command: ") and "whole context / this" in table
    assert report["context_tokens"] == 256 and report["slots"] == 4
    assert report["one_context_bucket"]["contexts"] == [256] and report["one_context_bucket"]["graphs"] == 3
    assert report["context_buckets"]["contexts"] == [128, 256] and report["context_buckets"]["graphs"] == 6
    assert [(row["batch"], row["context"]) for row in report["rows"]] == [(b, c) for b in (1, 4) for c in (128, 256)]
    assert all(row["step_ms"] > 0 and row["whole_context_over_this"] > 0 for row in report["rows"])
    assert (tmp_path / "serve_contexts.json").is_file()


def test_a_bad_shortest_bucket_is_one_line(tmp_path):
    assert bench_refused("serve_contexts", tmp_path, "--shortest", "0") == (
        "bench.serve_contexts: --repeats and --shortest take 1 or more, got 50 and 0")
