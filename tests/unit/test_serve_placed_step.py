"""The step the server replays as a place target (serve/placed_step.py, ``hf:DIR,serve-decode``),
on the CPU with a real tiny transformers Llama: it is the graph backend's own decode forward (same
logits as the eager backend's decode of the same rows), its cache is named state, and a replay
writes only the rows of its bucket."""

import pytest
import torch
from recorded import tiny_causal_lm

from kernelfleet.errors import UsageError
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.workloads.targets import step_maker

pytestmark = pytest.mark.unit


@pytest.fixture
def folder(tmp_path):
    tiny_causal_lm().config.save_pretrained(tmp_path)
    return tmp_path


def test_the_target_is_the_servers_decode_forward_of_its_bucket(folder):
    step = step_maker(f"hf:{folder},serve-decode,batch=2,slots=4,context=32")("cpu", 0)
    assert step.name == f"hf:{folder.name}-serve-decode-b2"
    (inputs,) = step.args
    assert inputs.shape == (2, 2)
    buffers = dict(step.module.named_buffers())
    assert sorted(b for b in buffers if b.startswith("cache_")) == [
        "cache_0_keys", "cache_0_values", "cache_1_keys", "cache_1_values"]
    assert buffers["cache_0_keys"].shape[:1] == (4,)  # every slot's row: the server's whole cache
    reference = EagerBackend(step.module.model, 4, 32)
    for row, prompt in enumerate([[5, 9, 100, 3], [7, 7, 7, 7, 7, 7]]):
        reference.prefill(row, prompt)
    with torch.inference_mode():  # the cache is made in inference mode, as the server's
        for layer in range(2):  # the step's cache holds what the reference prefilled
            buffers[f"cache_{layer}_keys"].copy_(reference.cache.keys[layer])
            buffers[f"cache_{layer}_values"].copy_(reference.cache.values[layer])
    inputs.copy_(torch.tensor([[11, 12], [4, 6]]))  # tokens, positions: written in place, as between replays
    got = step.fn(*step.args)
    want = reference.decode([0, 1], [11, 12], [4, 6])
    assert got.shape == want.shape == (2, 256)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()


def test_a_replay_writes_only_its_buckets_rows_and_gives_the_same_logits_again(folder):
    step = step_maker(f"hf:{folder},serve-decode,batch=2,slots=4,context=16")("cpu", 0)
    cache = {n: b for n, b in step.module.named_buffers() if n.startswith("cache_")}
    with torch.inference_mode():
        for tensor in cache.values():
            tensor.normal_()
    before = {n: t.clone() for n, t in cache.items()}
    step.args[0].copy_(torch.tensor([[3, 0], [9, 0]]))  # one request at position 9, one pad row
    first = step.fn(*step.args).clone()
    for name, tensor in cache.items():
        assert torch.equal(tensor[2:], before[name][2:]), name  # rows past the bucket are never touched
        changed = (tensor != before[name]).any(-1).any(1)  # (rows, positions) that changed
        assert changed[0].nonzero().flatten().tolist() == [9] and changed[1].nonzero().flatten().tolist() == [0]
    assert torch.equal(step.fn(*step.args), first)  # the same bytes written again: a replay changes nothing it reads


@pytest.mark.parametrize("options, said", [
    (",decode,slots=2", "slots=N is an option of the serve-decode phase only"),
    (",serve-decode,slots=two", "option 'slots=two'"),
])
def test_bad_serve_decode_options_are_one_line_errors(folder, options, said):
    with pytest.raises(UsageError, match=said):
        step_maker(f"hf:{folder}{options}")


def test_a_serve_decode_target_without_a_model_directory_says_so(tmp_path):
    with pytest.raises(UsageError, match="no config.json there"):
        step_maker(f"hf:{tmp_path / 'nowhere'},serve-decode")


def test_the_gate_zeroes_the_steps_logits_though_they_are_inference_tensors(folder):
    """The step's logits come from inference mode; the gate zeroes a capture's outputs before a plan's
    run (only a run that writes them matches), which outside that mode raises (bench disagg refused
    every strategy of this step on an H100 so): ``runtime.gate.zero`` writes them in it."""
    from kernelfleet.runtime.gate import zero

    step = step_maker(f"hf:{folder},serve-decode,batch=2,slots=4,context=16")("cpu", 0)
    logits = step.fn(*step.args)
    assert logits.is_inference() and logits.abs().sum() > 0
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        logits.fill_(0)
    zero([logits])
    assert not logits.any()
