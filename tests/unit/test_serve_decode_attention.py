"""A decode step of the server never repeats the cache's key and value heads for the query heads.

transformers before 5.24 did, with a 4-D mask (the server always passes one): ``repeat_kv`` copied
every layer's keys and values to as many heads as the query has, in every decode step. On an H100
(2026-12-06, the image's transformers, older than 5.24) that was 64 copy kernels of the 8B's step
at batch 8 of 2,048 tokens, 49 % of its launch time (tests/replay/test_serve_two_h100.py). From 5.24 a one-token query
is folded onto the key/value heads instead (``pack_gqa``), so the serve extra asks for it."""

import pytest
import torch
from recorded import PROMPTS, tiny_causal_lm
from torch.utils._python_dispatch import TorchDispatchMode

from kernelfleet.serve.backend import EagerBackend

pytestmark = pytest.mark.unit
SLOTS, CONTEXT = 3, 64


class Shapes(TorchDispatchMode):
    """The shape of every tensor an aten op returns while it is on."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.seen.append((str(func), tuple(value.shape)))
        return out


@pytest.mark.parametrize("kind", ["llama", "qwen2-moe"])
def test_a_decode_step_reads_the_cache_heads_as_they_are(kind):
    model = tiny_causal_lm(kind)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert config.num_key_value_heads < config.num_attention_heads  # the tiny models share key/value heads
    backend = EagerBackend(model, slots=SLOTS, context_tokens=CONTEXT)
    for slot, prompt in enumerate(PROMPTS[:SLOTS]):
        backend.prefill(slot, prompt)
    with Shapes() as shapes:
        backend.decode(list(range(SLOTS)), [1, 2, 3], [len(p) for p in PROMPTS[:SLOTS]])
    # the keys and values attention reads: the cache's heads over the positions so far (more than the new one)
    read = {shape[2] for _, shape in shapes.seen
            if len(shape) == 4 and shape[:2] == (SLOTS, config.num_key_value_heads) and shape[3] == head_dim
            and shape[2] > 1}
    assert read
    repeated = {(SLOTS, config.num_attention_heads, length, head_dim) for length in read}
    assert not [op for op, shape in shapes.seen if shape in repeated]
