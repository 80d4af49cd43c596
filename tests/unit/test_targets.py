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
    ("hf:{tmp}", {"phase": "chat"}, "unknown phase 'chat'"),
    ("hf:{tmp},generate", {}, "option 'generate': expected a phase"),
    ("hf:{tmp},batch=two", {}, "option 'batch=two'"),
    ("hf:{tmp},decode,context=1", {}, "at least 2, got 1"),
    ("hf:{tmp}", {"tokens": 0}, "batch and tokens must be at least 1"),
])
def test_a_bad_target_is_one_line_before_anything_is_built(tmp_path, target, kw, needle):
    tiny_llama_config().save_pretrained(tmp_path)
    with pytest.raises(UsageError, match=needle):
        step_maker(target.format(tmp=tmp_path), **kw)


def architectures():
    """Small configs of the transformers families the place half supports: dense, MoE, GPT-NeoX, Mamba."""
    from transformers import GPTNeoXConfig, MambaConfig, Qwen2MoeConfig

    return {"llama": tiny_llama_config(),
            "qwen2-moe": Qwen2MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                        shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64),
            "gpt-neox": GPTNeoXConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=64),
            "mamba": MambaConfig(vocab_size=128, hidden_size=64, state_size=8, num_hidden_layers=2)}


@pytest.mark.parametrize("family", ["llama", "qwen2-moe", "gpt-neox"])
def test_a_decode_step_is_the_full_forward_at_its_position_and_replays_alike(tmp_path, family):
    """One token into a static cache of 16 positions (15 filled by the prompt): its logits are the
    full forward's at position 15, and calling the step again gives them again bit for bit (it
    resets the cache's counter from its own position, so a captured graph replays alike)."""
    architectures()[family].save_pretrained(tmp_path)
    step = step_maker(f"hf:{tmp_path},decode,batch=2,context=16")("cpu", 0)
    token, position = step.args
    assert token.shape == (2, 1) and position.tolist() == [15]
    with torch.no_grad():
        first, again = step.fn(*step.args), step.fn(*step.args)
        model = step.module.model
        prompt = torch.randint(0, 128, (2, 15), generator=torch.Generator().manual_seed(0))  # as the step drew it
        full = model(input_ids=torch.cat([prompt, token], 1), use_cache=False).logits[:, -1:]
    assert torch.equal(first, again)
    torch.testing.assert_close(first.float(), full.float(), atol=3e-2, rtol=3e-2)
    names = {n for n, _ in step.module.named_buffers()}
    assert {"cache_0_keys", "cache_0_values", "cache_1_keys", "cache_1_values"} <= names  # state, by name


@pytest.mark.parametrize("family", ["qwen2-moe", "gpt-neox", "mamba"])
def test_every_family_prefills(tmp_path, family):
    architectures()[family].save_pretrained(tmp_path)
    step = step_maker(f"hf:{tmp_path},batch=2,tokens=8")("cpu", 0)
    with torch.no_grad():
        assert step.fn(*step.args).shape == (2, 8, 128)


def test_a_mamba_decode_step_advances_its_named_state_and_replays_alike_once_it_is_put_back(tmp_path):
    """Mamba's cache is recurrent state: the step has no position, advances the convolution window
    and SSM state in place (named as state, as kernelfleet saves them), and from the state put back
    gives the same logits again, the full forward's after the prompt and the new token."""
    architectures()["mamba"].save_pretrained(tmp_path)
    step = step_maker(f"hf:{tmp_path},decode,batch=2,context=16")("cpu", 0)
    (token,) = step.args
    assert step.decode.recurrent and token.shape == (2, 1)
    state = dict(step.module.named_buffers())
    assert {"state_0_0_conv", "state_0_0_ssm", "state_1_0_conv", "state_1_0_ssm"} <= set(state)
    saved = {n: t.clone() for n, t in state.items()}
    with torch.no_grad():
        first = step.fn(*step.args)
        assert not torch.equal(state["state_0_0_ssm"], saved["state_0_0_ssm"])  # the step moved it on
        for n, t in state.items():
            t.copy_(saved[n])
        again = step.fn(*step.args)
        full = step.module.model(input_ids=torch.cat([step.decode.prompt, token], 1), use_cache=False).logits[:, -1:]
    assert torch.equal(first, again)
    torch.testing.assert_close(first.float(), full.float(), atol=3e-2, rtol=3e-2)


def test_the_multi_step_gate_goes_on_from_a_recurrent_state(tmp_path):
    """``decode_steps`` on a recurrent step: teacher-forced, step k's logits are the full forward's
    after the prompt, the step's token and the prompt's first k - 1 tokens; free-running, its greedy
    tokens are ``generate``'s from the prompt and the step's token."""
    from kernelfleet.runtime.gate import decode_steps

    architectures()["mamba"].save_pretrained(tmp_path)
    step = step_maker(f"hf:{tmp_path},decode,batch=2,context=16")("cpu", 0)
    state = dict(step.module.named_buffers())
    saved = {n: t.clone() for n, t in state.items()}
    out: list[torch.Tensor] = []

    def once() -> None:
        with torch.no_grad():
            out[:] = [step.fn(*step.args)]

    def put_back() -> None:
        for n, t in state.items():
            t.copy_(saved[n])

    (token,) = (t.clone() for t in step.args)
    prompt, model = step.decode.prompt, step.module.model
    logits, _ = decode_steps(once, step.args, step.decode, lambda: out[0], True, 4)
    put_back()
    with torch.no_grad():
        fed = torch.cat([prompt, token, prompt[:, :3]], 1)
        full = model(input_ids=fed, use_cache=False).logits[:, 15:19]
    torch.testing.assert_close(logits.view(4, 2, 128).transpose(0, 1), full.float(), atol=3e-2, rtol=3e-2)
    _, free = decode_steps(once, step.args, step.decode, lambda: out[0], False, 4)
    put_back()
    with torch.no_grad():
        generated = model.generate(torch.cat([prompt, token], 1), max_new_tokens=4, do_sample=False)[:, 16:]
    assert free == generated.T.tolist()
    assert torch.equal(step.args[0], token)


def test_the_multi_step_gate_decodes_the_prompts_last_positions_again(tmp_path):
    """What the gate runs on a decode step (``runtime.gate.decode_steps``), here eagerly on the CPU:
    teacher-forced, each step's logits are the full forward's at that position; free-running, its
    greedy tokens are transformers' own greedy ``generate`` from the same prefix; the step's inputs
    are as they were after."""
    from kernelfleet.runtime.gate import decode_steps

    tiny_llama_config().save_pretrained(tmp_path)
    step = step_maker(f"hf:{tmp_path},decode,batch=2,context=24")("cpu", 0)
    token, position = (t.clone() for t in step.args)
    out: list[torch.Tensor] = []

    def once() -> None:
        with torch.no_grad():
            out[:] = [step.fn(*step.args)]

    logits, forced = decode_steps(once, step.args, step.decode, lambda: out[0], True, 6)
    prompt, model = step.decode.prompt, step.module.model
    with torch.no_grad():
        full = model(input_ids=torch.cat([prompt, token], 1), use_cache=False).logits[:, 18:24]
    assert logits.shape == (6 * 2, 128)
    torch.testing.assert_close(logits.view(6, 2, 128).transpose(0, 1), full.float(), atol=3e-2, rtol=3e-2)
    _, free = decode_steps(once, step.args, step.decode, lambda: out[0], False, 6)
    with torch.no_grad():
        generated = model.generate(prompt[:, :19], max_new_tokens=6, do_sample=False)[:, 19:]
    assert free == generated.T.tolist()
    assert torch.equal(step.args[0], token) and torch.equal(step.args[1], position)
