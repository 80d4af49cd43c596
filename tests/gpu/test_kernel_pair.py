"""A pair of devices that run different kernels for the same ops, on one GPU (issue: "your own
model on GPUs that run different kernels"), through the CLI a user runs:

    kernelfleet profile TARGET --profile a:64 --profile b:32/math-attention --out PROF
    kernelfleet plan PROF/program.json PROF/costs.json --policy all --out PLANS
    kernelfleet bench disagg TARGET --plans PLANS --device a:64@0 --device b:32@0/math-attention

Device b captures the step with SDPA's math attention, a with the default (cuDNN on an H200): each
device captures for itself (a transformers Llama prefill, the reference Llama decode, and
transformers Llama and Qwen2-MoE decode steps into a static KV cache), ops are lined up into units, each device is timed on its own kernels,
and every strategy is gated against the single-device run — bit for bit where a strategy runs one
device's kernels only, within the tolerance where it mixes them. ``KF_RECORD=DIR`` keeps what the
runs wrote (the replay tests' data).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.place_pairs import target_of

pytestmark = pytest.mark.gpu

PAIR = {"a": "a:64@0", "b": "b:32@0/math-attention"}


def kf(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, text=True, timeout=420)
    print(" ".join(("kernelfleet",) + args), done.stdout[-6000:], done.stderr[-3000:], sep="\n")
    return done


@pytest.mark.parametrize("name", ["hf-llama-prefill", "llama-decode", "hf-llama-decode", "hf-qwen2moe-decode"])
def test_a_different_kernel_pair_is_profiled_planned_gated_and_timed(tmp_path, name):
    target = target_of(name, tmp_path)
    prof, plans, runs = tmp_path / "profile", tmp_path / "plans", tmp_path / "disagg"
    done = kf("profile", target, "--profile", "a:64", "--profile", "b:32/math-attention", "--trials", "3",
              "--out", str(prof))
    assert done.returncode == 0, done.stderr
    program = json.loads((prof / "program.json").read_text())
    costs = json.loads((prof / "costs.json").read_text())
    assert len(costs["seconds"]) == len(program["launches"]) > 0
    assert "run other kernels" in done.stdout
    # request distribution's own graph, each device on its own kernels, launched together once
    assert costs["graph_seconds_together"] > max(costs["graph_seconds"].values())
    done = kf("plan", str(prof / "program.json"), str(prof / "costs.json"), "--policy", "all", "--out", str(plans))
    assert done.returncode == 0, done.stderr
    done = kf("bench", "disagg", target, "--plans", str(plans), "--device", PAIR["a"], "--device", PAIR["b"],
              "--slots", "2", "--repeats", "10", "--costs", str(prof / "costs.json"), "--out", str(runs))
    assert done.returncode == 0, done.stderr
    found = json.loads((runs / "disagg.json").read_text())["strategies"]
    for device in PAIR:  # one device's own kernels only: its own replay, bit for bit
        assert found[f"single:{device}"]["gate"] == "identical" and found[f"single:{device}"]["seconds"] > 0
    mixed = {name: r for name, r in found.items() if not name.startswith("single:")}
    assert mixed and not [n for n, r in mixed.items() if r["gate"].startswith("outside tolerance")], mixed
    assert any(r["gate"].startswith("within tolerance") and r.get("seconds") for r in mixed.values())
    if name.startswith("hf-") and name.endswith("decode"):  # a decode step: the gate ran 8 steps more
        assert all("teacher-forced over 8 decode steps" in r["gate"] for r in mixed.values()
                   if r["gate"].startswith("within"))
    record = os.environ.get("KF_RECORD")
    if record:
        (Path(record) / name).mkdir(parents=True, exist_ok=True)
        for folder in (prof, plans, runs):
            for path in folder.iterdir():
                shutil.copy(path, Path(record) / name / f"{folder.name}.{path.name}")
