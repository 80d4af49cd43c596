"""Any model as a target: a reference step by name, MODULE:FACTORY, or a transformers model
directory (hf:DIR) with its weights or, given only its config, seeded random weights — each made
on the device asked for (here the CPU), and every bad target one line before anything is built."""

from __future__ import annotations

import pytest
import torch

from kernelfleet.errors import UsageError
from kernelfleet.workloads.steps import Step
from kernelfleet.workloads.targets import step_maker

pytestmark = pytest.mark.unit


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def test_a_reference_step_by_name():
    step = step_maker("llama-decode")("cpu", 0)
    assert isinstance(step, Step) and step.name == "llama-tiny-decode"


def test_a_factory_gets_the_device_and_seed_it_asks_for():
    step = step_maker("kernelfleet.workloads.steps:hf_llama")("cpu", 3)
    assert step.name == "hf-llama-prefill" and step.args[0].device.type == "cpu"
    again = step_maker("kernelfleet.workloads.steps:hf_llama")("cpu", 3)
    assert torch.equal(step.fn(*step.args), again.fn(*again.args))  # the seed made the same model


def test_a_config_only_directory_gets_seeded_random_weights(tmp_path):
    tiny_llama_config().save_pretrained(tmp_path)
    make = step_maker(f"hf:{tmp_path}", batch=2, tokens=16)
    first, again, other = make("cpu", 0), make("cpu", 0), make("cpu", 1)
    logits = first.fn(*first.args)
    assert logits.shape == (2, 16, 128) and logits.dtype == torch.bfloat16
    assert torch.equal(logits, again.fn(*again.args))
    assert not torch.equal(first.module.lm_head.weight, other.module.lm_head.weight)


def test_a_directory_with_weights_loads_them(tmp_path):
    from transformers import LlamaForCausalLM

    torch.manual_seed(7)
    saved = LlamaForCausalLM(tiny_llama_config()).to(torch.bfloat16).eval()
    saved.save_pretrained(tmp_path)
    step = step_maker(f"hf:{tmp_path}", batch=1, tokens=8)("cpu", 0)
    loaded = dict(step.module.named_parameters())
    assert all(torch.equal(loaded[name], p) for name, p in saved.named_parameters())  # every weight, exactly
    with torch.no_grad():  # the same function (a model cast to bf16 after it was built rounds its rotary table)
        torch.testing.assert_close(step.fn(*step.args), saved(input_ids=step.args[0], use_cache=False).logits,
                                   atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("target, kw, needle", [
    ("llama-9000", {}, "unknown step 'llama-9000'"),
    ("no.such.module:f", {}, "cannot import 'no.such.module'"),
    ("kernelfleet.workloads.steps:nothing_here", {}, "no callable 'nothing_here'"),
    ("hf:/nowhere", {}, "no config.json there"),
    ("hf:{tmp}", {"phase": "decode"}, "the 'decode' phase is not built yet"),
    ("hf:{tmp}", {"tokens": 0}, "batch and tokens must be at least 1"),
])
def test_a_bad_target_is_one_line_before_anything_is_built(tmp_path, target, kw, needle):
    tiny_llama_config().save_pretrained(tmp_path)
    with pytest.raises(UsageError, match=needle):
        step_maker(target.format(tmp=tmp_path), **kw)
