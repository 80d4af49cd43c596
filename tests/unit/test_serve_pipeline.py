"""The layer pipeline on the CPU, two CPU stages as the two devices: each stage builds only its
part of the model (its parameters counted, and equal to the whole model's, from safetensors or
from the seed); greedy tokens through the stages equal transformers' ``generate`` for a dense and
an MoE model, eagerly and through the graph path's CPU twin, with requests sharing the slots of
two micro-batch groups, and over HTTP with many interleaved clients; the cut balances layers
under the caps, accepts a model larger than any one cap, and refuses in one line a stage that
cannot fit."""

import copy
import re

import httpx
import pytest
import torch
from recorded import PROMPTS, interleaved, reference, served_model, serving, stepped, tiny_causal_lm

from kernelfleet.errors import UsageError
from kernelfleet.serve.command import Placed, default_micro_batches, micro_batch_slots
from kernelfleet.serve.cut import StageSizes, cut
from kernelfleet.serve.memory import FIXED_WORKSPACE_BYTES, planned_slots
from kernelfleet.serve.model import footprint
from kernelfleet.serve.parts import build_part, stage_sizes
from kernelfleet.serve.pipeline import PipelineBackend, Stage
from kernelfleet.serve.strategies import pipeline

pytestmark = pytest.mark.unit
KINDS = ["llama", "qwen2-moe"]
LENGTHS = [12, 5, 9, 16, 3, 7]
HALVES = [range(1), range(1, 2)]


@pytest.fixture(scope="module", params=KINDS)
def saved(request, tmp_path_factory):
    """(kind, the model, a directory of its safetensors, a directory of its config alone, with a
    padding token, and a directory of its pytorch_model.bin)."""
    model = tiny_causal_lm(request.param, seed=3)
    weights, config, bins = (tmp_path_factory.mktemp(name) for name in ("weights", "config", "bins"))
    model.save_pretrained(weights)
    padded = copy.deepcopy(model.config)
    padded.pad_token_id = 3  # its initialiser zeroes that row of the embedding through a view
    padded.save_pretrained(config)
    model.config.save_pretrained(bins)  # as transformers 4 saved weights before safetensors: one pickled state dict
    torch.save(model.state_dict(), bins / "pytorch_model.bin")
    return request.param, model, weights, config, bins


def stages_of(folder, seed=0):
    return [Stage(build_part(f"hf:{folder}", layers, "cpu", seed, torch.float32), name)
            for layers, name in zip(HALVES, ["cpu0", "cpu1"])]


def test_each_stage_holds_only_its_parameters_and_they_are_the_whole_models(saved):
    from transformers import AutoConfig, AutoModelForCausalLM

    _, model, weights, config, bins = saved
    torch.manual_seed(11)  # the whole-model build a config-only directory stands for, from the same seed
    seeded = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config), dtype=torch.float32)
    for folder, whole in [(weights, model), (bins, model), (config, seeded)]:
        expected = dict(whole.named_parameters())
        first, last = (build_part(f"hf:{folder}", layers, "cpu", 11, torch.float32) for layers in HALVES)
        held = {}
        for part, mine in [(first, "model.layers.0."), (last, "model.layers.1.")]:
            for name, tensor in part.module.named_parameters():
                whole_name = name.replace("model.layers.0.", mine)
                assert whole_name not in held  # no parameter is held twice
                held[whole_name] = tensor
                torch.testing.assert_close(tensor, expected[whole_name], rtol=0, atol=0)
        assert set(held) == set(expected)
        assert sum(t.numel() for t in held.values()) == sum(t.numel() for t in whole.parameters())
        assert {n.split(".")[1] for n, _ in first.module.named_parameters()} == {"embed_tokens", "layers"}
        assert "lm_head.weight" in dict(last.module.named_parameters()) and last.base.embed_tokens is None
        assert first.module.lm_head is None


@pytest.mark.parametrize("graphs", [False, True])
def test_greedy_tokens_through_the_stages_equal_generate(saved, graphs):
    kind, model, weights, *_ = saved
    stages = stages_of(weights)
    # context buckets of 8 tokens and up: the steps cross from one into the next
    plan = pipeline([PipelineBackend(stages, n, 64, graphs=graphs, shortest=8) for n in (2, 1)])
    replayed, original = set(), stages[0].forward

    def forward(inputs, cache, rows, positions, length):
        if rows is None:  # a bucket's graph-safe forward: what a GPU replays
            replayed.add(length)
        return original(inputs, cache, rows, positions, length)

    stages[0].forward = forward
    got, groups, busy = stepped(plan, PROMPTS, LENGTHS)
    for prompt, n, tokens in zip(PROMPTS, LENGTHS, got):
        assert tokens == reference(model, prompt, n, eos=False), (kind, prompt)
    assert groups[0] == [0, 0, 1]  # three requests at once, in both micro-batch groups
    assert set(busy) == {"cpu0", "cpu1"} and all(seconds > 0 for seconds in busy.values())
    if graphs:  # each stage's cache holds its own layers only, in rows 0 .. running-1
        assert [sorted(cache.keys) for cache in plan.backends[0].caches] == [[0], [1]]
        assert plan.backends[0].lengths == [8, 16, 32, 64] and replayed == {8, 16, 32}


def test_many_interleaved_requests_over_http_each_get_their_own_tokens():
    """The bounded load test under the pipeline: 24 clients, 8 at a time, half streaming."""
    llama = tiny_causal_lm("llama", seed=3)
    prompts = [[(11 * i + j) % 256 for j in range(1 + i % 7)] for i in range(24)]
    lengths = [2 + (3 * i) % 9 for i in range(24)]
    expected = [reference(llama, p, n, eos=False) for p, n in zip(prompts, lengths)]


    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        llama.save_pretrained(folder)
        devices = [Placed(s.name, s.part, 4) for s in stages_of(folder)]
    with serving(served_model(llama), slots=4, max_queue=24, strategy="pipeline", devices=devices,
                 graphs=True, micro_batches=2, shortest=8) as (url, engine):
        assert [b.slots for b in engine.strategy.backends] == [2, 2]
        assert all(b.lengths == [8, 16, 32, 64, 128] for b in engine.strategy.backends)  # crossed: positions to 17
        got = interleaved(url, prompts, lengths, 8)
        metrics = httpx.get(f"{url}/metrics").text
    assert got == expected
    for device in ("cpu0", "cpu1"):
        assert f'kernelfleet_serve_device_busy_seconds_total{{device="{device}"}}' in metrics
    assert 'kernelfleet_serve_requests_total{finish_reason="length"} 24.0' in metrics


def test_a_model_over_every_cap_fits_as_stages_and_not_whole(saved):
    _, model, weights, *_ = saved
    target = f"hf:{weights}"
    sizes = stage_sizes(target, torch.float32, 64)
    whole = footprint(target, torch.float32, 64)
    parameters_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sizes.embedding_bytes + sum(sizes.layer_bytes) + sizes.head_bytes == parameters_bytes
    assert sizes.kv_bytes_per_slot_layer * 2 == whole.kv_bytes_per_slot
    cap = FIXED_WORKSPACE_BYTES + whole.weights_bytes * 3 // 4  # under the weights alone, over each half
    with pytest.raises(UsageError, match="does not fit under the cap of a"):  # what single and replicas check
        planned_slots(whole, cap, 1, "under the cap of a")
    layers, slots = cut(sizes, [cap, cap], 2, ["under a", "under b"])
    assert layers == HALVES and slots == 2


def sizes_of(layers, layer_bytes=100, embedding=50, head=60):
    return StageSizes(embedding, [layer_bytes] * layers, head, kv_bytes_per_slot_layer=10, logits_bytes_per_slot=3,
                      hidden_bytes_per_slot=1)


def test_the_cut_balances_layers_and_moves_them_off_a_device_that_cannot_hold_its_share():
    roomy = FIXED_WORKSPACE_BYTES + 10_000
    assert cut(sizes_of(8), [roomy, roomy], 4, ["a", "b"])[0] == [range(4), range(4, 8)]
    assert cut(sizes_of(7), [roomy] * 3, 4, ["a", "b", "c"])[0] == [range(3), range(3, 6), range(6, 7)]
    # the first device holds its embedding and at most 2 layers of 4 slots (50 + 200 + 80 + 4): the rest go on
    small = FIXED_WORKSPACE_BYTES + 334
    assert cut(sizes_of(8), [small, roomy], 4, ["a", "b"])[0] == [range(2), range(2, 8)]
    # slots sized: as many as the fullest stage holds
    tight = FIXED_WORKSPACE_BYTES + 50 + 400 + 10 * 4 * 11
    assert cut(sizes_of(8), [tight, roomy], None, ["a", "b"]) == ([range(4), range(4, 8)], 10)


def test_a_stage_that_cannot_fit_is_refused_in_one_line():
    roomy, small = FIXED_WORKSPACE_BYTES + 10_000, FIXED_WORKSPACE_BYTES + 100
    with pytest.raises(UsageError) as refused:
        cut(sizes_of(4), [roomy, small], 2, ["under the cap of a (x)", "under the cap of b (y)"])
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("the model does not fit as stage 2 of 2 (layers 2-3 and the norm and head) under the cap "
                           "of b (y): 2 slots need ")
    assert "(weights 0.00 GiB" in line and "raise the cap, or lower --slots or --context" in line
    with pytest.raises(UsageError, match=re.escape("it takes 2 to 4 --device, got 5")):
        cut(sizes_of(4), [roomy] * 5, 2, ["x"] * 5)


@pytest.mark.parametrize("broken", ["truncated", "index"])
def test_a_broken_checkpoint_is_refused_in_one_line_naming_its_file(saved, tmp_path, broken):
    _, model, _, _, bins = saved
    model.config.save_pretrained(tmp_path)
    whole = (bins / "pytorch_model.bin").read_bytes()
    if broken == "truncated":
        (tmp_path / "pytorch_model.bin").write_bytes(whole[:len(whole) // 2])
        says = "pytorch_model.bin does not load"
    else:
        (tmp_path / "pytorch_model.bin.index.json").write_text('{"weight_map": [1, 2]')
        says = "pytorch_model.bin.index.json is not a checkpoint index"
    with pytest.raises(UsageError) as refused:
        build_part(f"hf:{tmp_path}", HALVES[0], "cpu", 0, torch.float32)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_micro_batch_groups_split_the_slots_evenly_and_are_two_only_where_stages_overlap():
    assert default_micro_batches(["cuda:0", "cuda:1"]) == 2
    assert default_micro_batches(["cuda:0", "cuda:0"]) == 1 and default_micro_batches(["cpu", "cpu"]) == 1
    assert micro_batch_slots(8, 2) == [4, 4]
    assert micro_batch_slots(5, 2) == [3, 2]
    assert micro_batch_slots(1, 2) == [1]
    assert micro_batch_slots(6, 1) == [6]
