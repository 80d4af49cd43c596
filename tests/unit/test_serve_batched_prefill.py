"""Batched prefill (``--prefill-batch``) on the CPU with real tiny transformers models: a batched
forward writes each prompt's keys and values and gives its logits as a prefill alone does; a step
takes at most the batch, oldest first, and within the padded-token bound; a backend without
``prefill_many`` takes them one at a time; flags that do not combine are refused in one line.
(Greedy tokens equal to ``generate`` under every strategy, and many requests over HTTP each
getting their own tokens, with prompts batched or in chunks: test_serve_chunks.py.)"""


import pytest
import torch
from recorded import (
    PROMPTS,
    reference,
    tiny_causal_lm,
)

from kernelfleet.errors import UsageError
from kernelfleet.serve.backend import EagerBackend, right_aligned
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.graphs import GraphBackend
from kernelfleet.serve.sampling import Sampling
from kernelfleet.serve.scheduler import PREFILL_BATCH_TOKENS
from kernelfleet.serve.strategies import split

pytestmark = pytest.mark.unit
KINDS = ["llama", "qwen2-moe"]
LENGTHS = [12, 5, 9, 16, 3, 7]


class Counted:
    """Each ``prefill_many`` and ``prefill`` call a backend gets: the slots and prompt lengths."""

    def __init__(self, backend):
        self.calls = []
        one, many = backend.prefill, backend.prefill_many
        backend.prefill = lambda slot, ids, start=0: self.calls.append(([slot], [len(ids)])) or one(slot, ids, start)
        backend.prefill_many = lambda slots, prompts: self.calls.append((list(slots), list(map(len, prompts)))) \
            or many(slots, prompts)


class OneAtATime:
    """A backend with ``prefill`` and ``decode`` only (as the placed backend is), its prefills kept in ``calls``."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []
        self.device, self.slots, self.context_tokens = backend.device, backend.slots, backend.context_tokens

    def prefill(self, slot, token_ids, start=0):
        self.calls.append(([slot], [len(token_ids)]))
        return self.backend.prefill(slot, token_ids, start)

    def decode(self, slots, token_ids, positions):
        return self.backend.decode(slots, token_ids, positions)


def test_prompts_are_right_aligned_their_pads_at_the_pad_position():
    ids, positions, longest = right_aligned([[5, 6, 7], [9]], 63)
    assert ids == [[5, 6, 7], [0, 0, 9]] and positions == [[0, 1, 2], [63, 63, 0]] and longest == 3


def test_a_batched_prefill_writes_each_prompt_as_a_prefill_alone_does():
    model = tiny_causal_lm("llama")
    together, alone = EagerBackend(model, 3, 32), EagerBackend(model, 3, 32)
    prompts = [PROMPTS[4], PROMPTS[0], PROMPTS[3]]  # 18, 4 and 1 tokens
    logits = together.prefill_many([2, 0, 1], prompts)
    for row, (slot, prompt) in enumerate(zip([2, 0, 1], prompts)):
        torch.testing.assert_close(logits[row], alone.prefill(slot, prompt), rtol=1e-5, atol=1e-5)
        for layer, keys in alone.cache.keys.items():  # the prompt's positions; the pads wrote only the last
            torch.testing.assert_close(together.cache.keys[layer][slot, :, :len(prompt)], keys[slot, :, :len(prompt)],
                                       rtol=1e-5, atol=1e-5)


def test_a_step_prefills_at_most_the_batch_oldest_first_within_the_token_bound():
    model = tiny_causal_lm("llama")
    backend = GraphBackend(EagerBackend(model, 6, 64), graphs=False)
    counted = Counted(backend)
    engine = Engine(backend, max_queue=8, prefill_batch=4)
    sinks = [[] for _ in PROMPTS]
    for prompt, sink in zip(PROMPTS, sinks):
        engine.submit(prompt, 3, frozenset(), Sampling(temperature=0.0), lambda t, f, sink=sink: sink.append(t))
    engine.step()
    assert counted.calls == [([0, 1, 2, 3], [4, 11, 7, 1])]  # the oldest four in one forward
    assert [len(s) for s in sinks] == [2, 2, 2, 2, 0, 0]  # each its first token, then the step's decode
    engine.step()
    assert counted.calls[1:] == [([4, 5], [18, 8])]
    while engine.step():
        pass
    assert sinks == [reference(model, p, 3, eos=False) for p in PROMPTS]
    text = engine.metrics.exposition().decode()
    assert f"kernelfleet_serve_prompt_tokens_total {float(sum(map(len, PROMPTS)))}" in text
    assert "kernelfleet_serve_time_to_first_token_seconds_count 6.0" in text
    # prompts whose padded batch would pass the bound go in the next forward
    long = PREFILL_BATCH_TOKENS // 2
    engine = Engine(EagerBackend(model, 4, long + 8), max_queue=4, prefill_batch=4)
    counted = Counted(engine.backend)
    for prompt in [[1] * 8, [2] * long, [3] * 4]:
        engine.submit(prompt, 1, frozenset(), Sampling(temperature=0.0), lambda t, f: None)
    engine.step()
    assert counted.calls == [([0, 1], [8, long])]  # a third would make 3 x long padded tokens


def test_the_split_prefills_as_many_as_it_has_staging_slots_in_one_forward_and_hands_each_over():
    model = tiny_causal_lm("llama")
    prefill, decode = EagerBackend(model, 3, 64, "pre"), GraphBackend(EagerBackend(model, 4, 64), graphs=False,
                                                                      device_name="dec")
    counted = Counted(prefill)
    engine = Engine(split(prefill, decode), max_queue=8, prefill_batch=8)
    sinks = [[] for _ in range(4)]
    for prompt, sink in zip(PROMPTS[:4], sinks):
        engine.submit(prompt, 3, frozenset(), Sampling(temperature=0.0), lambda t, f, sink=sink: sink.append(t))
    engine.step()
    assert counted.calls == [([0, 1, 2], [4, 11, 7])]  # three staging slots: three prompts, the fourth next step
    assert [len(s) for s in sinks] == [2, 2, 2, 0]  # each handed over, its first token, then a decode there
    while engine.step():
        pass
    assert counted.calls[1:] == [([0], [1])]  # alone: prefill(), into the first staging slot
    assert sinks == [reference(model, p, 3, eos=False) for p in PROMPTS[:4]]


def test_a_backend_without_prefill_many_takes_the_batch_one_prompt_at_a_time():
    model = tiny_causal_lm("llama")
    backend = OneAtATime(EagerBackend(model, 3, 64))
    engine = Engine(backend, max_queue=4, prefill_batch=3)
    sinks = [[] for _ in range(3)]
    for prompt, sink in zip(PROMPTS[:3], sinks):
        engine.submit(prompt, 2, frozenset(), Sampling(temperature=0.0), lambda t, f, sink=sink: sink.append(t))
    engine.step()
    assert backend.calls == [([0], [4]), ([1], [11]), ([2], [7])]
    while engine.step():
        pass
    assert sinks == [reference(model, p, 2, eos=False) for p in PROMPTS[:3]]


def test_prefill_flags_that_do_not_combine_are_refused_in_one_line():
    model = tiny_causal_lm("llama")
    with pytest.raises(UsageError, match="--prefill-batch takes the whole prompts one forward prefills at most"):
        Engine(EagerBackend(model, 1, 64), max_queue=1, prefill_batch=0)
    with pytest.raises(UsageError, match="pass one of the two"):
        Engine(EagerBackend(model, 1, 64), max_queue=1, prefill_batch=2, prefill_chunk_tokens=16)
