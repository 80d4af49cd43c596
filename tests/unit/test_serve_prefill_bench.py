"""``bench.serve_prefill``'s control flow on the CPU (``--cpu --quick``, the tiny model): every
length and batch is timed both ways, one at a time and together, with the mixed-length row; its
JSON is the table's; a bad flag is one line."""

import pytest
from recorded import bench_quick, bench_refused

pytestmark = pytest.mark.unit


def test_the_dry_run_times_every_length_and_batch_both_ways(tmp_path):
    table, report = bench_quick("serve_prefill", args=("--cpu", "--out", str(tmp_path)))
    assert table.startswith("command: ") and "one at a time ms" in table
    assert [(row["prompt_tokens"], row["batch"]) for row in report["rows"]] == [
        (length, batch) for length in ("16", "64", "64-512") for batch in (1, 4)]
    assert all(row["one_at_a_time_ms"] > 0 and row["together_ms"] > 0 for row in report["rows"])
    assert all(row["speedup"] == pytest.approx(row["one_at_a_time_ms"] / row["together_ms"]) for row in report["rows"])
    assert (tmp_path / "serve_prefill.json").is_file()


def test_a_bad_batch_list_is_one_line(tmp_path):
    assert bench_refused("serve_prefill", tmp_path, "--batches", "4,x") == (
        "bench.serve_prefill: --batches takes distinct whole numbers of prompts, comma-separated, got '4,x'")
