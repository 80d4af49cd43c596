"""``bench.serve_gpu``'s control flow on the CPU (``--cpu --quick``, tiny models): every case's
server starts, the batch-1 table and the loads run, every request gets its tokens, the capped
pair's two ways (replicas, pipeline) run with the slots they set and are compared, once a
prefill setting (``--prefill-chunk`` and ``--prefill-batch`` values that combine) and side by side;
the trace it wrote replays; a bad trace file, chunk or batch list is one line."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from recorded import bench_quick

pytestmark = pytest.mark.unit
ROOT = Path(__file__).parents[2]


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
        for name, slots in [("llama8b", 4), ("capped-replicas", 2), ("capped-pipeline", 4)]]
    assert all(case["flags"][-4:] == ["--prefill-chunk", str(case["prefill_chunk_tokens"]), "--prefill-batch",
                                      str(case["prefill_batch"])] for case in report["cases"])
    assert llama["overhead"]["bare_ms_per_token"] > 0 and pipeline["overhead"] is None
    assert [(pair["prefill_chunk_tokens"], pair["prefill_batch"]) for pair in report["capped_pairs"]] == settings
    assert all((pair["replicas_slots"], pair["pipeline_slots"]) == (2, 4) for pair in report["capped_pairs"])
    assert "pipeline / replicas: " in table and "(target >= 2x)" in table
    assert " chunk  batch  replicas  pipeline  ratio" in table  # the settings side by side
    for case in report["cases"]:
        assert [load["requests"] for load in case["poisson"]] == [3] * len(case["poisson"])
        assert all(load["output_tokens"] >= 3 and load["tokens_per_second"] > 0 for load in case["poisson"])
    with (tmp_path / "trace.csv").open() as file:
        written = list(csv.DictReader(file))
    assert report["cases"][0]["trace"]["requests"] == len(written) == 6
    assert (tmp_path / "serve_gpu.json").is_file() and (tmp_path / "server-capped-pipeline-chunk8-batch1.log").is_file()


def test_a_bad_prefill_chunk_list_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench.serve_gpu", "--cpu", "--prefill-chunk", "0,x", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1 and done.stderr.strip() == (
        "bench.serve_gpu: --prefill-chunk takes distinct whole numbers of tokens (0: whole prompts), comma-separated, "
        "got '0,x'")


def test_a_bad_prefill_batch_list_or_setting_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for flags, said in [(["--prefill-batch", "0"], "bench.serve_gpu: --prefill-batch takes distinct whole numbers of "
                         "prompts (1 or more), comma-separated, got '0'"),
                        (["--prefill-chunk", "8", "--prefill-batch", "4"], "bench.serve_gpu: --prefill-chunk 8 and "
                         "--prefill-batch 4 leave no setting the server takes (a chunk goes with a batch of 1)")]:
        done = subprocess.run([sys.executable, "-m", "bench.serve_gpu", "--cpu", *flags, "--out", str(tmp_path)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 1 and done.stderr.strip() == said


def test_a_bad_trace_file_is_one_line(tmp_path):
    bad = tmp_path / "trace.csv"
    bad.write_text("arrival_seconds,prompt_tokens,output_tokens\n0.5,12,x\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench.serve_gpu", "--cpu", "--trace", str(bad), "--out",
                           str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"bench.serve_gpu: --trace {bad} line 2: expected arrival_seconds,prompt_tokens,"
                                   "output_tokens (a number, two whole numbers), got {'arrival_seconds': '0.5', "
                                   "'prompt_tokens': '12', 'output_tokens': 'x'}")
