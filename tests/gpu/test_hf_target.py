"""A transformers model directory as a target on a real GPU: ``kernelfleet analyze hf:DIR`` captures
it and its claims hold on replay, and ``kernelfleet run hf:DIR`` places it across two partitions of
the GPU behind the gate (outputs bit for bit the home device's own replay)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def model_dir(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=4, max_position_embeddings=256).save_pretrained(tmp_path / "llama")
    return tmp_path / "llama"


def kf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("options", ["", ",decode,batch=4,context=128"])
def test_analyze_captures_a_config_only_transformers_directory(model_dir, tmp_path, options):
    analyzed(f"hf:{model_dir}{options}", tmp_path)


@pytest.mark.parametrize("family", ["gpt-neox", "mamba"])
def test_analyze_captures_the_decode_step_of_other_families(tmp_path, family):
    """GPT-NeoX (a KV cache at positions) and Mamba (recurrent state advanced in place, put back
    before every replay) from transformers, decode steps captured and their claims checked."""
    from transformers import GPTNeoXConfig, MambaConfig

    config = GPTNeoXConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                           num_attention_heads=8, max_position_embeddings=256) if family == "gpt-neox" else \
        MambaConfig(vocab_size=512, hidden_size=256, state_size=16, num_hidden_layers=2)
    config.save_pretrained(tmp_path / family)
    analyzed(f"hf:{tmp_path / family},decode,batch=4,context=128", tmp_path)


def analyzed(target: str, tmp_path) -> dict:
    done = kf("analyze", target, "--out", str(tmp_path / "an"), "--json")
    print(done.stdout[-2000:], done.stderr[-2000:])
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["launches"] > 20 and found["node_by_node_equals_graph"] is True
    assert found["unsound_writes"] == 0 and found["probe_disagreements"] == 0
    return found


def test_run_places_it_across_two_partitions_behind_the_gate(model_dir, tmp_path):
    done = kf("analyze", f"hf:{model_dir}", "--out", str(tmp_path / "an"), "--no-check", "--json")
    assert done.returncode == 0, done.stderr
    n = json.loads(done.stdout)["launches"]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"kernelfleet_plan": 1, "policy": "split-halves", "assignment":
                                ["a"] * (n // 2) + ["b"] * (n - n // 2), "objective_seconds": 0.0,
                                "lower_bound_seconds": 0.0, "details": {"home": "a"}}))
    ran = kf("run", f"hf:{model_dir}", "--plan", str(plan), "--device", "a:64@0", "--device", "b:32@0",
             "--repeats", "20")
    print(ran.stdout, ran.stderr[-2000:])
    assert ran.returncode == 0, ran.stderr
    assert "gate identical" in ran.stdout and "ms per step" in ran.stdout
