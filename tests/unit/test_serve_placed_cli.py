"""``kernelfleet serve hf:DIR --plans DIR --profile ...`` refuses, in one line and before any weight
loads or any GPU is touched, what cannot be served: a missing plan folder, bucket or plan, a plan
file that is not a plan, a ``--device`` cap that names no profile or another GPU, and flags that do
not go together (the first case as a user runs it, in
its own process; the others through the same entry point in this one)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from recorded import free_port, run_main, tiny_causal_lm

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).parents[1] / "data" / "h200-kernel-pair" / "hf-llama-decode"
PROFILES = ["--profile", "a:64@0", "--profile", "b:32@0"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_causal_lm("llama").config.save_pretrained(folder)
    return folder


@pytest.fixture
def plans(tmp_path):
    """Plans of bucket 1 only (the server's 2 slots need buckets 1 and 2)."""
    (tmp_path / "batch-1").mkdir()
    for policy in ("latency-greedy", "throughput-milp"):
        shutil.copy(RECORDED / f"plans.{policy}.json", tmp_path / "batch-1" / f"{policy}.json")
    return tmp_path


def refused(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "serve", *args, "--listen", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=300, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_missing_bucket_is_named_with_the_buckets_the_server_captures(model_dir, plans):
    line = refused(f"hf:{model_dir}", "--plans", str(plans), *PROFILES, "--slots", "2", "--context", "64")
    assert "no plans for batch bucket 2" in line and "the server captures buckets 1, 2" in line
    assert "kernelfleet plan ... --out" in line


def test_without_slots_the_server_serves_the_plan_folders_largest_bucket(monkeypatch, capsys, model_dir, plans):
    (plans / "batch-4").mkdir()
    (plans / "batch-x").mkdir()  # not a bucket: left alone
    said = in_process(monkeypatch, capsys, f"hf:{model_dir}", "--plans", str(plans), *PROFILES, "--context", "64")
    assert "no plans for batch bucket 2" in said and "the server captures buckets 1, 2, 4" in said
    for folder in ("batch-1", "batch-4"):
        shutil.rmtree(plans / folder)
    said = in_process(monkeypatch, capsys, f"hf:{model_dir}", "--plans", str(plans), *PROFILES)
    assert "no batch-B folder" in said


def in_process(monkeypatch, capsys, *args: str) -> str:
    code, line = run_main(monkeypatch, capsys, *args, "--listen", f"127.0.0.1:{free_port()}")
    assert code == 2, line
    return line


def test_a_missing_folder_a_missing_plan_and_a_broken_plan_file_are_one_line(monkeypatch, capsys, model_dir, plans):
    said = in_process(monkeypatch, capsys, f"hf:{model_dir}", "--plans", str(plans / "nowhere"), *PROFILES)
    assert "no such folder" in said
    (plans / "batch-1" / "throughput-milp.json").unlink()
    said = in_process(monkeypatch, capsys, f"hf:{model_dir}", "--plans", str(plans), *PROFILES, "--slots", "1")
    assert "batch-1: no throughput-milp.json" in said
    (plans / "batch-1" / "throughput-milp.json").write_text('{"policy": 3}')
    said = in_process(monkeypatch, capsys, f"hf:{model_dir}", "--plans", str(plans), *PROFILES, "--slots", "1")
    assert "throughput-milp.json" in said


@pytest.mark.parametrize("extra, says", [
    ([], "--plans runs on two or more --profile NAME:SMS[+HOG]@GPU"),
    (["--cpu", *PROFILES], "--plans DIR and --profile go together, on GPUs, without --cpu"),
    (["--strategy", "replicas", "--device", "a:1", "--device", "b:1", *PROFILES], "without --cpu or --strategy"),
    ([*PROFILES, "--device", "c:1"], "--device c:1: no --profile is named c (profiles: a, b)"),
    ([*PROFILES, "--device", "b:1@1"], "--device b:1@1: the profile b is on GPU 0"),
    ([*PROFILES, "--device", "a:1", "--device", "a:2"], "--device a:2: a is capped twice"),
    ([*PROFILES, "--device", "a"], "--device takes NAME:MEMORY_GB[@GPU]"),
    (["--profile", "a:64@0", "--profile", "a:32@0"], "--plans runs on two or more --profile"),
])
def test_flags_that_do_not_go_with_plans_are_one_line(monkeypatch, capsys, model_dir, plans, extra, says):
    assert says in in_process(monkeypatch, capsys, f"hf:{model_dir}", "--plans", str(plans), *extra)
