"""The reference workloads on the CPU at their tiny presets.

Exactness checks run in float32: the cached paths (KV cache, recurrent SSM state) compute the same
sums as the full forward but in a different order or shape (masked attention over the whole cache
versus causal attention over the prompt), so they agree to float32 rounding, not bit for bit.
ATOL = 1e-5 is ~100x the differences seen (~1e-7 on logits of magnitude ~0.5).
"""

import dataclasses
import random
import statistics

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from kernelfleet.errors import UsageError
from kernelfleet.workloads import FAMILIES, build_preset, param_count, preset
from kernelfleet.workloads.config import DiTConfig, MoEConfig
from kernelfleet.workloads.dit import DiT
from kernelfleet.workloads.layers import build
from kernelfleet.workloads.moe import MoETransformer
from kernelfleet.workloads.requests import choice, fixed, offline_batches, poisson_requests, uniform

pytestmark = pytest.mark.unit
ATOL = 1e-5
F32 = torch.float32


def tokens(cfg, batch, length, seed=1):
    return torch.randint(0, cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def images(cfg, batch, seed=2):
    v = cfg.vision
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, v.channels, v.image_size, v.image_size, generator=gen)


def latents(cfg, seed=3):
    shape = (cfg.batch, cfg.latent_channels, cfg.latent_size, cfg.latent_size)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)), torch.tensor([10.0, 700.0])


def run(family, model, length=6):
    """One prefill and one decode step (or one denoise step) on fixed inputs; the outputs."""
    cfg = model.cfg
    if family == "dit":
        return (model.denoise_step(*latents(cfg)),)
    llm = cfg.llm if family == "vlm" else cfg
    toks = tokens(llm, llm.max_batch, length + 1)
    extra = (images(cfg, llm.max_batch),) if family == "vlm" else ()
    first = cfg.vision.n_image_tokens + length if family == "vlm" else length
    model.reset_state()
    logits = model.prefill(toks[:, :length], *extra)
    return logits, model.decode(toks[:, length], torch.full((llm.max_batch,), first))


# --- shapes, sizes, determinism -------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_steps_have_the_documented_shapes_in_bf16(family):
    model = build_preset(family, "tiny")
    outputs = run(family, model)
    assert all(o.dtype == torch.bfloat16 for o in outputs)
    if family == "dit":
        assert outputs[0].shape == latents(model.cfg)[0].shape
    else:
        llm = model.cfg.llm if family == "vlm" else model.cfg
        assert [tuple(o.shape) for o in outputs] == [(llm.max_batch, llm.vocab_size)] * 2


@pytest.mark.parametrize("family", FAMILIES)
def test_param_count_formula_matches_the_built_model(family):
    model = build_preset(family, "tiny")
    assert sum(p.numel() for p in model.parameters()) == param_count(family, "tiny")


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_outputs_other_seed_other_outputs(family):
    cfg = preset(family, "tiny")
    if family == "dit":  # adaLN-Zero outputs 0 whatever the seed: compare with random modulations
        cfg = dataclasses.replace(cfg, adaln_zero_init=False)
    cls = type(build_preset(family, "tiny"))
    a, b, c = (run(family, build(cls, cfg, seed=s, dtype=F32)) for s in (7, 7, 8))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not any(torch.equal(x, z) for x, z in zip(a, c))


def test_unknown_family_or_preset_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown workload family"):
        preset("gpt5", "tiny")
    with pytest.raises(UsageError, match="unknown preset"):
        preset("llama", "b200")


# --- cached decode equals the full forward --------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "moe", "vlm", "mamba"])
def test_decode_after_prefill_equals_full_prefill_at_the_next_positions(family):
    model = build_preset(family, "tiny", dtype=F32)
    cfg = model.cfg.llm if family == "vlm" else model.cfg
    toks = tokens(cfg, cfg.max_batch, 10)
    extra = (images(model.cfg, cfg.max_batch),) if family == "vlm" else ()
    offset = model.cfg.vision.n_image_tokens if family == "vlm" else 0
    model.prefill(toks[:, :6], *extra)  # then decode positions 6..9 one at a time
    stepped = [model.decode(toks[:, n], torch.full((cfg.max_batch,), offset + n)) for n in range(6, 10)]
    for n, got in zip(range(6, 10), stepped):
        model.reset_state()
        want = model.prefill(toks[:, : n + 1], *extra)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_decode_rows_at_different_positions_use_their_own_cache_lengths():
    model = build_preset("llama", "tiny", dtype=F32)
    toks = tokens(model.cfg, 2, 8)
    want = [model.prefill(toks[r : r + 1, : n + 1])[0] for r, n in ((0, 4), (1, 7))]
    model.reset_state()
    model.prefill(toks[:, :4])
    for n in range(4, 7):  # row 1 fills positions 4..6 while row 0 rewrites the same entry at 4
        model.decode(torch.stack([toks[0, 4], toks[1, n]]), torch.tensor([4, n]))
    got = model.decode(torch.stack([toks[0, 4], toks[1, 7]]), torch.tensor([4, 7]))
    torch.testing.assert_close(got, torch.stack(want), atol=ATOL, rtol=0)


# --- MoE routing ----------------------------------------------------------------------------------


def reference_moe(mlp, x):
    """Per token: argsort the router logits, softmax over the best k, sum those experts' SwiGLUs."""
    out, chosen = torch.zeros_like(x), []
    for i in range(x.shape[0]):
        logits = mlp.router(x[i])
        idx = logits.argsort(descending=True)[: mlp.top_k]
        gates = F.softmax(logits[idx], dim=-1)
        chosen.append(idx)
        for g, e in zip(gates, idx):
            out[i] += g * (F.silu(x[i] @ mlp.w1[e]) * (x[i] @ mlp.w3[e])) @ mlp.w2[e]
    return out, torch.stack(chosen)


def test_moe_routes_each_token_to_its_top_k_experts_and_mixes_them():
    mlp = build_preset("moe", "tiny", dtype=F32).layers[0].mlp
    x = torch.randn(12, mlp.router.in_features, generator=torch.Generator().manual_seed(4))
    want, want_idx = reference_moe(mlp, x)
    top_idx, gates = mlp.route(x)
    assert torch.equal(top_idx, want_idx)
    torch.testing.assert_close(gates.sum(-1), torch.ones(12))
    torch.testing.assert_close(mlp(x), want, atol=ATOL, rtol=0)  # dropless: capacity = tokens


def test_moe_shapes_stay_fixed_whatever_the_routing_and_overflow_is_dropped():
    cfg = dataclasses.replace(MoEConfig.tiny(), capacity_factor=1.0)
    mlp = build(MoETransformer, cfg, seed=0, dtype=F32).layers[0].mlp
    x = torch.randn(16, cfg.dim, generator=torch.Generator().manual_seed(5))
    capacity = mlp.capacity(16)  # ceil(1.0 * 16 * 2 / 8) = 4
    balanced = mlp.dispatch(mlp.route(x)[0])
    with torch.no_grad():  # every token now prefers experts 0 then 1: 16 tokens, 4 slots each
        mlp.router.weight.zero_()
        mlp.router.weight[0, 0], mlp.router.weight[1, 0] = 2.0, 1.0
    x[:, 0] = x[:, 0].abs() + 1.0
    skewed_idx = mlp.route(x)[0]
    assert (skewed_idx == torch.tensor([0, 1])).all()
    skewed = mlp.dispatch(skewed_idx)
    assert balanced.shape == skewed.shape == (cfg.n_experts, capacity)
    assert skewed[0].tolist() == [0, 1, 2, 3]  # the earliest tokens win the slots
    out = mlp(x)
    assert out.shape == x.shape
    assert (out[4:] == 0).all() and (out[:4] != 0).any()  # tokens 4.. dropped by both experts


# --- DiT ------------------------------------------------------------------------------------------


def test_adaln_zero_blocks_are_the_identity_and_the_output_zero_at_init():
    model = build(DiT, DiTConfig.tiny(), seed=0, dtype=F32)
    x = torch.randn(2, model.cfg.n_tokens, model.cfg.dim)
    c = torch.randn(2, model.cfg.dim)
    for block in model.blocks:
        assert torch.equal(block(x, c), x)
    assert torch.equal(model.denoise_step(*latents(model.cfg)), torch.zeros_like(latents(model.cfg)[0]))


def test_unpatchify_inverts_patchify():
    from kernelfleet.workloads.multimodal import patchify

    model = build(DiT, DiTConfig.tiny(), seed=0, dtype=F32)
    z = latents(model.cfg)[0]
    assert torch.equal(model.unpatchify(patchify(z, model.cfg.patch_size)), z)


# --- FLOP formulas against FlopCounterMode --------------------------------------------------------
# FlopCounterMode counts matmuls, convolutions and attention; on a CPU SDPA is only counted through
# the math backend (it decomposes into bmm). Both sides then count the same work, and the formulas
# match exactly, except Mamba's decode conv: an elementwise window product the counter does not
# see (2·d_inner·d_conv per token per layer). The formulas leave out norms, RoPE, softmax, SiLU,
# the scan's elementwise work and the embedding lookup, as the counter does.


def counted(fn, *args):
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


@pytest.mark.parametrize("family", ["llama", "moe", "mamba", "moe-capacity"])
def test_llm_flop_formulas_match_the_flop_counter(family):
    if family == "moe-capacity":  # capacity padding: executed = E * C rows, not k * tokens
        model = build(MoETransformer, dataclasses.replace(MoEConfig.tiny(), capacity_factor=1.5), seed=0)
    else:
        model = build_preset(family, "tiny")
    cfg = model.cfg
    toks = tokens(cfg, 2, 7)
    assert counted(model.prefill, toks) == model.prefill_flops(2, 7, executed=True)
    got = counted(model.decode, toks[:, 0], torch.tensor([7, 7]))
    want = model.decode_flops(2, 8, executed=True)
    tolerance = 2 * cfg.n_layers * 2 * cfg.d_inner * cfg.d_conv if family == "mamba" else 0
    assert want - tolerance == got
    assert model.prefill_flops(2, 7) <= model.prefill_flops(2, 7, executed=True)


def test_vlm_and_dit_flop_formulas_match_the_flop_counter():
    vlm = build_preset("vlm", "tiny")
    toks = tokens(vlm.cfg.llm, 2, 5)
    assert counted(vlm.prefill, toks, images(vlm.cfg, 2)) == vlm.prefill_flops(2, 5, executed=True)
    dit = build_preset("dit", "tiny")
    assert counted(dit.denoise_step, *latents(dit.cfg)) == dit.step_flops()


def test_useful_flops_count_the_causal_triangle_and_the_chosen_experts_only():
    llama = build_preset("llama", "tiny")
    c = llama.cfg
    masked_half = 4 * c.n_heads * c.head_dim * 2 * (7 * 7 - 7 * 8 // 2) * c.n_layers
    assert llama.prefill_flops(2, 7, executed=True) - llama.prefill_flops(2, 7) == masked_half
    moe = build_preset("moe", "tiny")  # dropless: executed runs all 8 experts on every token
    m = moe.cfg
    extra = 2 * 3 * m.dim * m.ffn_dim * (m.n_experts - m.top_k) * 2 * m.n_layers
    assert moe.decode_flops(2, 8, executed=True) - moe.decode_flops(2, m.max_seq_len) == extra


# --- request generators ---------------------------------------------------------------------------


def test_poisson_inter_arrival_mean_is_one_over_rate_and_reproducible():
    reqs = list(poisson_requests(4.0, 20_000, uniform(3, 9), choice([1, 16]), vocab_size=50, seed=11))
    arrivals = [r.arrival_seconds for r in reqs]
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)  # std error of the mean 0.7 %
    assert all(3 <= r.prompt_tokens <= 9 and r.output_tokens in (1, 16) for r in reqs)
    assert all(0 <= t < 50 for r in reqs[:100] for t in r.prompt)
    again = list(poisson_requests(4.0, 20_000, uniform(3, 9), choice([1, 16]), vocab_size=50, seed=11))
    assert again == reqs
    other = list(poisson_requests(4.0, 100, uniform(3, 9), choice([1, 16]), vocab_size=50, seed=12))
    assert other != reqs[:100]


def test_offline_batches_are_fixed_size_and_arrive_at_zero():
    batches = list(offline_batches(3, 4, prompt_len=5, output_len=2, vocab_size=10, seed=0))
    assert [len(b) for b in batches] == [4, 4, 4]
    assert [r.request_id for b in batches for r in b] == list(range(12))
    shapes = {(r.arrival_seconds, r.prompt_tokens, r.output_tokens) for b in batches for r in b}
    assert shapes == {(0.0, 5, 2)}
    assert batches == list(offline_batches(3, 4, prompt_len=5, output_len=2, vocab_size=10, seed=0))


def test_generators_reject_bad_arguments():
    with pytest.raises(UsageError, match="rate_per_second must be > 0"):
        next(poisson_requests(0.0, 5, fixed(4), fixed(4), vocab_size=10))
    with pytest.raises(UsageError, match="lengths must be >= 1"):
        next(poisson_requests(1.0, 5, fixed(0), fixed(4), vocab_size=10))
    with pytest.raises(UsageError, match="batch_size must be > 0"):
        next(offline_batches(1, 0, 4, 4, vocab_size=10))
    assert fixed(3)(random.Random(0)) == 3


def test_moe_active_parameters():
    from kernelfleet.workloads.config import MoEConfig
    from kernelfleet.workloads.moe import active_param_count

    cfg = MoEConfig.tiny()
    model = build_preset("moe", "tiny", dtype=torch.float32)
    # one expert's three matrices (w1, w3, w2 hold all experts stacked): what a token skips
    # in each expert it is not routed to
    stacked = [p for name, p in model.named_parameters() if name.startswith("layers.0.mlp.w")]
    per_expert = sum(p[0].numel() for p in stacked)
    total = sum(p.numel() for p in model.parameters())
    assert active_param_count(cfg) == total - cfg.n_layers * (cfg.n_experts - cfg.top_k) * per_expert
    assert round(active_param_count(MoEConfig.h200()) / 1e9, 2) == 4.19  # gpt-oss-20B quotes 3.6 B (MXFP4, tied heads)


def test_reference_steps_by_name():
    from kernelfleet.workloads.steps import REFERENCE, reference

    assert {"llama8b-decode", "moe-decode", "hf-llama-prefill-compiled"} <= set(REFERENCE)
    step = reference("llama-decode", device="cpu", seed=1)
    assert step.name == "llama-tiny-decode" and step.args[0].device.type == "cpu"
    with pytest.raises(UsageError, match="unknown step 'nope'"):
        reference("nope")
