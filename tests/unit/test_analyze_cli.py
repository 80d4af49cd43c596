"""`kernelfleet analyze --capture`, `calibrate` and `profile` argument handling, on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.profile.run import parse_profile

pytestmark = pytest.mark.unit

CAPTURE = Path(__file__).parents[1] / "data" / "h200-capture" / "llama-decode.capture.json.gz"


def kernelfleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, text=True, timeout=120)


def test_analyze_a_recorded_capture(tmp_path):
    done = kernelfleet("analyze", "--capture", str(CAPTURE), "--out", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    numbers = json.loads(done.stdout)
    assert numbers["step"] == "llama-tiny-decode" and numbers["kernels"] == 134 and numbers["pinned"] == 0
    assert (tmp_path / "program.json").stat().st_size > 0
    assert (tmp_path / "graph.dot").read_text().startswith("digraph program {")


@pytest.mark.parametrize("args, message", [
    ((), "give MODULE:FACTORY"),
    (("kernelfleet.workloads.steps:llama_decode",), "runs on an NVIDIA GPU"),
    (("--capture", "/no/such/file.json.gz"), "cannot read a raw capture"),
])
def test_analyze_errors_are_one_line(args, message):
    done = kernelfleet("analyze", *args)
    assert done.returncode in (2, 3) and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_calibrate_and_profile_refuse_bad_input_before_any_gpu_work():
    done = kernelfleet("calibrate", "--against", "l40s,nope")
    assert done.returncode == 2 and "unknown GPU key 'nope'" in done.stderr
    done = kernelfleet("calibrate", "--against", "l40s")
    assert done.returncode == 2 and "COMPUTE_SKU,BANDWIDTH_SKU" in done.stderr


def test_profile_specs():
    assert parse_profile("compute:56+64").hog_sms == 64
    assert parse_profile("bandwidth:32").sms == 32 and parse_profile("bandwidth:32").hog_sms is None
    assert parse_profile("whole").sms is None
    assert parse_profile("bandwidth:32@1").device == 1 and parse_profile("compute:56+64").device == 0
    assert parse_profile("b:32@0/math-attention").kernels == "math-attention"
    assert parse_profile("a:64").kernels == "default" and parse_profile("a:64/default").sms == 64
    for bad in ("compute:5x", ":32", "odd:12", "bandwidth:32@x", "bandwidth:32@", "b:32/cudnn-please", "b:32/"):
        with pytest.raises(UsageError):
            parse_profile(bad)


def test_profile_options_are_checked_before_any_gpu_work():
    done = kernelfleet("profile", "kernelfleet.workloads.steps:llama_decode", "--flush-l2-mb", "-1")
    assert done.returncode == 2 and "--flush-l2-mb >= 0" in done.stderr


def test_disagg_checks_its_arguments_before_any_gpu_work(tmp_path):
    done = kernelfleet("bench", "disagg", "llama-9000", "--plans", str(tmp_path))
    assert done.returncode == 2 and "unknown step 'llama-9000'" in done.stderr
    done = kernelfleet("bench", "disagg", "llama8b-decode", "--plans", str(tmp_path / "none"))
    assert done.returncode == 2 and "no such folder" in done.stderr
    done = kernelfleet("bench", "disagg", "llama8b-decode", "--plans", str(tmp_path), "--device", "a:32@0")
    assert done.returncode == 2 and "two profiles" in done.stderr
