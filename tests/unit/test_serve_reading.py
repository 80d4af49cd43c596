"""A device's share that is no pipeline stage (serve/parts.build_reading, what ``kernelfleet serve
--plans`` loads on each device other than home): the whole model, only the named parameters
allocated, each equal to the whole model's bit for bit (from safetensors or from the seed), every
other parameter a view of one zeroed scratch tensor; the model still runs, and the layers whose
weights it holds compute what the whole model's do; what it allocates is known from the config
before it loads (``reading_bytes``). A name the model lacks is one line."""

import pytest
import torch
from recorded import tiny_causal_lm

from kernelfleet.errors import UsageError
from kernelfleet.serve.parts import build_reading, reading_bytes

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module", params=["llama", "qwen2-moe"])
def saved(request, tmp_path_factory):
    """(the model, a directory of its safetensors, a directory of its config alone, the model that
    config draws from seed 5)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = tiny_causal_lm(request.param, seed=3)
    weights, config = tmp_path_factory.mktemp("weights"), tmp_path_factory.mktemp("config")
    model.save_pretrained(weights)
    model.config.save_pretrained(config)
    torch.manual_seed(5)
    seeded = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config), dtype=torch.float32).eval()
    return model, weights, config, seeded


def storages(module) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in module.parameters()}


@pytest.mark.parametrize("source", ["weights", "config"])
def test_only_the_named_parameters_are_held_and_equal_the_whole_models(saved, source):
    model, weights, config, seeded = saved
    folder, whole = (weights, model) if source == "weights" else (config, seeded)
    expected = dict(whole.named_parameters())
    names = {n for n in expected if n.startswith("model.layers.1.mlp.")} | {"lm_head.weight"}
    built, held = build_reading(f"hf:{folder}", names, "cpu", 5, torch.float32)
    params = dict(built.named_parameters())
    assert set(params) == set(expected)
    assert held == sum(expected[n].numel() * 4 for n in names)
    for name in names:
        torch.testing.assert_close(params[name], expected[name], rtol=0, atol=0)
    others = [params[n] for n in expected if n not in names]
    assert len({t.untyped_storage().data_ptr() for t in others}) == 1  # one scratch, zeroed
    assert all(not t.any() for t in others)
    largest = max(t.numel() for t in others) * 4
    assert sum(storages(built).values()) == held + largest < sum(storages(whole).values())
    assert reading_bytes(f"hf:{folder}", names, torch.float32) == held + largest  # known before any allocation
    for name, buffer in whole.named_buffers():  # the rotary frequencies, computed, not left empty
        torch.testing.assert_close(dict(built.named_buffers())[name], buffer, rtol=0, atol=0)
    hidden = torch.randn(1, 3, model.config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(built.model.layers[1].mlp(hidden), whole.model.layers[1].mlp(hidden),
                                   rtol=0, atol=0)
        assert built(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, model.config.vocab_size)


def test_a_name_the_model_lacks_is_one_line(saved):
    _, weights, *_ = saved
    with pytest.raises(UsageError, match=r"has no parameter model\.layers\.7\.mlp\.up_proj\.weight .*another model") as found:
        build_reading(f"hf:{weights}", {"model.layers.7.mlp.up_proj.weight"}, "cpu", 0, torch.float32)
    assert "\n" not in str(found.value)


def test_a_cache_keeps_only_its_held_layers_and_the_others_share_one_scratch():
    """``SlotCache(held=...)`` (what a device other than home gets under ``serve --plans`` when the
    plans keep the cache home): after a forward, the held layer's keys have a tensor of their own,
    written in the prompt's row only, while every other cache is one scratch of that shape (what its
    forward computes past them is garbage: its plans never run those kernels there); moving a
    request's row moves the held layer's row and leaves the scratch alone."""
    from kernelfleet.serve.backend import EagerBackend

    kept = EagerBackend(tiny_causal_lm("llama", seed=1), 4, 32, held={(1, "keys")})
    kept.prefill(2, [5, 6, 7])
    own = kept.cache.keys[1]
    others = [kept.cache.keys[0], kept.cache.values[0], kept.cache.values[1]]
    assert len({t.data_ptr() for t in others}) == 1 and own.data_ptr() != others[0].data_ptr()
    assert own[2, :, :3].abs().sum() > 0 and not own[[0, 1, 3]].any() and not own[2, :, 3:].any()
    row, scratch = own[2, :, :3].clone(), others[0].clone()
    with torch.inference_mode():  # as the engine moves rows
        kept.cache.exchange(2, 0, 3)
    torch.testing.assert_close(own[0, :, :3], row, rtol=0, atol=0)
    torch.testing.assert_close(others[0], scratch, rtol=0, atol=0)
