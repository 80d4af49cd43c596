"""Chunked prefill (``--prefill-chunk``) on the CPU with real tiny transformers models: prompts
cut into chunks smaller than themselves, or up to 4 whole prompts in one forward
(``--prefill-batch``), give transformers' ``generate`` tokens token for token, for a dense and an
MoE model, under one device (eager and the graph backend's CPU twin), request distribution, the
layer pipeline and the prefill/decode split; a step prefills at most the budget,
oldest first; many requests of mixed prompt lengths in flight each get their own tokens; a request
cancelled mid-prefill frees its slot and its row, and the metrics count each prompt token once."""

import tempfile

import httpx
import pytest
import torch
from recorded import (
    PROMPTS,
    cpu_strategy,
    interleaved,
    reference,
    served_model,
    serving,
    stepped,
    tiny_causal_lm,
)

from kernelfleet.errors import UsageError
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.command import Placed
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.graphs import GraphBackend
from kernelfleet.serve.parts import build_part
from kernelfleet.serve.rows import Rows
from kernelfleet.serve.sampling import Sampling

pytestmark = pytest.mark.unit
KINDS = ["llama", "qwen2-moe"]
LENGTHS = [12, 5, 9, 16, 3, 7]
CHUNK = 3  # smaller than every prompt of PROMPTS but [200]: most take two to six chunks
# chunks of CHUNK, or up to 4 whole prompts in one forward (--prefill-batch)
PREFILLS = {"chunk3": {"prefill_chunk_tokens": CHUNK}, "batch4": {"prefill_batch": 4}}


class Recorded:
    """Each prefill call a backend gets, ``(slot, start, tokens)``, kept in ``calls``."""

    def __init__(self, backend):
        self.calls, self.forward = [], backend.prefill
        backend.prefill = self

    def __call__(self, slot, token_ids, start=0):
        self.calls.append((slot, start, len(token_ids)))
        return self.forward(slot, token_ids, start)


@pytest.mark.parametrize("prefill", list(PREFILLS), ids=list(PREFILLS))
@pytest.mark.parametrize("strategy", ["eager", "graphs", "replicas", "pipeline", "split"])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_with_prompts_in_chunks_or_batched_equal_generate(kind, strategy, prefill):
    model = tiny_causal_lm(kind)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        plan = cpu_strategy(strategy, model, folder)
    got, _, _ = stepped(plan, PROMPTS, LENGTHS, **PREFILLS[prefill])
    for prompt, n, tokens in zip(PROMPTS, LENGTHS, got):
        assert tokens == reference(model, prompt, n, eos=False), (strategy, prompt)


def test_a_step_prefills_at_most_the_budget_oldest_first_and_decodes_only_whole_prompts():
    model = tiny_causal_lm("llama")
    backend = GraphBackend(EagerBackend(model, 4, 64), graphs=False)
    prefills, decodes = Recorded(backend), []
    decode = backend.decode
    backend.decode = lambda slots, ids, positions: decodes.append((list(slots), list(positions))) or \
        decode(slots, ids, positions)
    engine = Engine(backend, max_queue=8, prefill_chunk_tokens=5)
    sinks = [[] for _ in range(3)]
    for prompt, sink in zip([PROMPTS[1], PROMPTS[0], PROMPTS[4]], sinks):  # 11, 4 and 18 tokens
        engine.submit(prompt, 4, frozenset(), Sampling(temperature=0.0), lambda t, f, sink=sink: sink.append(t))
    engine.step()
    assert prefills.calls == [(0, 0, 5)] and decodes == []  # 5 of the first's 11 tokens; nothing to decode yet
    engine.step()
    assert prefills.calls[1:] == [(0, 5, 5)] and sinks[0] == []
    engine.step()  # the first's last token, then 4 of the second's: both whole, their first tokens, then a decode
    assert prefills.calls[2:] == [(0, 10, 1), (1, 0, 4)] and [len(s) for s in sinks] == [2, 2, 0]
    assert decodes == [([0, 1], [11, 4])]
    engine.step()  # the third's first 5 of 18: it holds slot 2 (and a row) but does not decode
    assert prefills.calls[4:] == [(2, 0, 5)] and decodes[1:] == [([0, 1], [12, 5])]
    while engine.step():
        pass
    assert all(sum(n for slot, start, n in prefills.calls if slot == s) == len(p)
               for s, p in enumerate([PROMPTS[1], PROMPTS[0], PROMPTS[4]]))
    assert sinks == [reference(model, p, 4, eos=False) for p in [PROMPTS[1], PROMPTS[0], PROMPTS[4]]]
    text = engine.metrics.exposition().decode()
    assert "kernelfleet_serve_prompt_tokens_total 33.0" in text  # 11 + 4 + 18, each once
    assert "kernelfleet_serve_time_to_first_token_seconds_count 3.0" in text


def test_a_request_being_prefilled_keeps_its_row_while_the_running_ones_move_into_the_first_rows():
    rows = Rows(3)
    assert [rows.take(s) for s in (0, 1, 2)] == [0, 1, 2]
    rows.compact([0, 1, 2])
    # 0 left; the newcomer in slot 0 is being prefilled in row 0: running 1 and 2 need rows 0 and 1
    assert rows.take(0) == 0
    assert rows.compact([1, 2], holding=0) == [(2, 2, 0)]  # 2 exchanges rows with it: 0 goes up to row 2
    assert rows.row_of == {0: 2, 1: 1, 2: 0}
    assert rows.compact([1, 2, 0]) == []  # its prompt is whole: it decodes where it is
    assert rows.compact([0], holding=2) == [(0, 2, 0)] and rows.row_of == {0: 0, 2: 2}


def test_a_running_request_exchanges_rows_with_one_being_prefilled_and_both_keep_their_keys():
    model = tiny_causal_lm("llama")
    backend, alone = (GraphBackend(EagerBackend(model, 2, 32), graphs=False) for _ in range(2))
    backend.prefill(0, PROMPTS[0])
    backend.prefill(1, PROMPTS[2])
    backend.decode([0, 1], [1, 2], [4, 7])
    cache = backend.eager_backend.cache
    # slot 0 leaves; a newcomer there is part prefilled in row 0, and running slot 1 (row 1) must come down
    backend.prefill(0, PROMPTS[4][:6])
    mine = {layer: keys[1, :, :8].clone() for layer, keys in cache.keys.items()}
    theirs = {layer: keys[0, :, :6].clone() for layer, keys in cache.keys.items()}
    backend.decode([1], [3], [8])
    assert backend.rows.row_of == {1: 0, 0: 1}
    for layer, keys in cache.keys.items():
        torch.testing.assert_close(keys[0, :, :8], mine[layer])
        torch.testing.assert_close(keys[1, :, :6], theirs[layer])  # the part-prefilled prompt, kept
    # the rest of its prompt, then its decode: the tokens of a backend that prefilled it whole
    first = backend.prefill(0, PROMPTS[4][6:], 6)
    torch.testing.assert_close(first, alone.prefill(0, PROMPTS[4]), rtol=1e-5, atol=1e-5)
    token = int(first.argmax())
    torch.testing.assert_close(backend.decode([0, 1], [token, 4], [18, 9])[0], alone.decode([0], [token], [18])[0],
                               rtol=1e-5, atol=1e-5)


def test_a_request_cancelled_mid_prefill_frees_its_slot_and_its_tokens_count_once():
    model = tiny_causal_lm("llama")
    engine = Engine(GraphBackend(EagerBackend(model, 1, 64), graphs=False), max_queue=4, prefill_chunk_tokens=4)
    gone, waiting = [], []
    request = engine.submit(PROMPTS[4], 6, frozenset(), Sampling(temperature=0.0), lambda t, f: gone.append((t, f)))
    engine.submit(PROMPTS[1], 5, frozenset(), Sampling(temperature=0.0), lambda t, f: waiting.append(t))
    engine.step()
    engine.step()  # 8 of its 18 prompt tokens in
    assert request.prefilled == 8 and engine.partial is not None
    engine.cancel(request)
    while engine.step():
        pass
    assert gone == [] and engine.partial is None and not engine.scheduler.running
    assert waiting == reference(model, PROMPTS[1], 5, eos=False)  # the slot went to the next, which it prefilled over
    text = engine.metrics.exposition().decode()
    assert "kernelfleet_serve_prompt_tokens_total 19.0" in text  # 8 of the cancelled one's, 11 of the other's
    assert 'kernelfleet_serve_requests_total{finish_reason="cancelled"} 1.0' in text
    assert "kernelfleet_serve_time_to_first_token_seconds_count 1.0" in text
    with pytest.raises(UsageError, match="--prefill-chunk takes a number of tokens, 0 for whole prompts, got -1"):
        Engine(EagerBackend(model, 1, 64), max_queue=1, prefill_chunk_tokens=-1)
    assert Engine(EagerBackend(model, 1, 64), max_queue=1, prefill_chunk_tokens=0).prefill_chunk_tokens is None


@pytest.mark.parametrize("prefill", [{"prefill_chunk_tokens": 4}, {"prefill_batch": 4}], ids=["chunk4", "batch4"])
@pytest.mark.parametrize("strategy", ["single", "pipeline"])
def test_many_requests_of_mixed_prompt_lengths_over_http_each_get_their_own_tokens(strategy, prefill):
    """24 clients, 8 at a time, half streaming, prompts of 1 to 40 tokens in chunks of 4 or up to 4
    a forward through the graph backend's CPU twin (row moves past a part-prefilled request) or the
    pipeline."""
    llama = tiny_causal_lm("llama", seed=3)
    prompts = [[(11 * i + j) % 256 for j in range(1 + (7 * i) % 40)] for i in range(24)]
    lengths = [2 + (3 * i) % 9 for i in range(24)]
    expected = [reference(llama, p, n, eos=False) for p, n in zip(prompts, lengths)]
    options = {}
    if strategy == "pipeline":
        with tempfile.TemporaryDirectory() as folder:
            llama.save_pretrained(folder)
            options = {"strategy": "pipeline", "micro_batches": 2,
                       "devices": [Placed(name, build_part(f"hf:{folder}", layers, "cpu", 0, torch.float32), 4)
                                   for name, layers in [("cpu0", range(1)), ("cpu1", range(1, 2))]]}
    with serving(served_model(llama), slots=4, max_queue=24, graphs=True, **prefill, **options) as (url, engine):
        assert (engine.prefill_chunk_tokens or 1, engine.prefill_batch) == (prefill.get("prefill_chunk_tokens", 1),
                                                                            prefill.get("prefill_batch", 1))
        got = interleaved(url, prompts, lengths, 8)
        metrics = httpx.get(f"{url}/metrics").text
    assert got == expected
    assert f"kernelfleet_serve_prompt_tokens_total {float(sum(map(len, prompts)))}" in metrics
    assert 'kernelfleet_serve_requests_total{finish_reason="length"} 24.0' in metrics
