"""``kernelfleet run`` on a real GPU: the product path from a plan file to a gated, timed run.

Two green-context partitions of the one GPU are the pair. The tiny Llama decode step is captured
here once to learn its launches; a plan splitting them between the partitions is written as a
file; the CLI then captures a replica per device, validates the plan, gates it (outputs bit for
bit the home device's own replay) and times it. A plan naming a device the run does not have is
refused in one line before anything is captured.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

DEVICES = ["--device", "a:64@0", "--device", "b:32@0"]


def _launches() -> int:
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.cuda.capture import capture
    from kernelfleet.workloads.steps import reference

    step = reference("llama-decode")
    return len(assemble(capture(step.fn, step.args, module=step.module, what=step.name).raw).launches)


def _plan(tmp_path, assignment: list[str], home: str) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"kernelfleet_plan": 1, "policy": "split-halves", "assignment": assignment,
                                "objective_seconds": 0.0, "lower_bound_seconds": 0.0, "details": {"home": home}}))
    return str(path)


def kf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, text=True, timeout=300)


def test_a_split_plan_runs_gated_and_timed_through_the_cli(tmp_path):
    n = _launches()
    done = kf("run", "llama-decode", "--plan", _plan(tmp_path, ["a"] * (n // 2) + ["b"] * (n - n // 2), "a"),
              *DEVICES, "--repeats", "20")
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert "identical" in done.stdout and "ms" in done.stdout


def test_a_plan_for_other_devices_is_refused_in_one_line(tmp_path):
    n = _launches()
    done = kf("run", "llama-decode", "--plan", _plan(tmp_path, ["a"] * (n - 1) + ["gpu9"], "a"), *DEVICES)
    print(done.stderr)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "gpu9" in done.stderr
