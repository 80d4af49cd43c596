"""The graph backend's control flow on the CPU: the graph-safe forward (the first rows, masked,
persistent inputs: the call a GPU captures) gives the eager forward's logits and cache contents,
for a dense and an MoE model, across mixed positions and reused slots; running requests are kept
in the first rows; pad rows write only rows no running request holds, at the context's last
position; batch and context buckets; and the engine over the backend's CPU twin, crossing context
buckets, gives ``generate``'s tokens."""

import pytest
import torch
from recorded import PROMPTS, reference, tiny_causal_lm

from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.graphs import Bucket, GraphBackend, bucket_for, buckets, lengths, padded
from kernelfleet.serve.rows import Rows
from kernelfleet.serve.sampling import Sampling

pytestmark = pytest.mark.unit
KINDS = ["llama", "qwen2-moe"]


def static_decode(backend, slots, tokens, positions, length):
    """The graph-safe forward over persistent inputs, as a bucket of exactly this batch and context
    ``length`` runs it (its rows the cache's first: the slots here are 0 .. n-1 in order)."""
    assert slots == list(range(len(slots)))
    return Bucket(len(slots), torch.tensor([tokens, positions]), length).forward(backend)


@pytest.mark.parametrize("kind", KINDS)
def test_the_graph_safe_forward_gives_the_eager_logits_and_cache_across_positions_and_reused_slots(kind):
    model = tiny_causal_lm(kind)
    eager, static = (EagerBackend(model, slots=3, context_tokens=48) for _ in range(2))
    for backend in (eager, static):
        for slot, prompt in enumerate(PROMPTS[:3]):
            backend.prefill(slot, prompt)
    position = {slot: len(p) for slot, p in enumerate(PROMPTS[:3])}
    token = {0: 11, 1: 22, 2: 33}
    steps = [[0, 1, 2], [0, 1], [0], [0, 1, 2], "reuse 1", [0, 1], [0, 1, 2]]
    for step in steps:
        if step == "reuse 1":  # a shorter prompt takes slot 1 over: what its last request left must not count
            for backend in (eager, static):
                backend.prefill(1, PROMPTS[3])
            position[1] = len(PROMPTS[3])
            continue
        args = (step, [token[s] for s in step], [position[s] for s in step])
        want = eager.decode(*args)
        # the whole context, and the shortest context bucket that holds the furthest position (both
        # write the same keys and values: the second writes them again)
        for length in (48, bucket_for(max(args[2]) + 1, lengths(48, shortest=8))):
            torch.testing.assert_close(static_decode(static, *args, length), want, rtol=1e-5, atol=1e-5)
        for s in step:
            token[s] = int(want[step.index(s)].argmax())
            position[s] += 1
    for layer in eager.cache.keys:
        for s in range(3):  # every position a request wrote; past them a slot holds what the last one left
            torch.testing.assert_close(static.cache.keys[layer][s, :, :position[s]],
                                       eager.cache.keys[layer][s, :, :position[s]], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(static.cache.values[layer][s, :, :position[s]],
                                       eager.cache.values[layer][s, :, :position[s]], rtol=1e-5, atol=1e-6)


def test_running_requests_move_into_the_first_rows_and_pad_rows_write_only_rows_none_holds():
    model = tiny_causal_lm("llama")
    graphs = GraphBackend(EagerBackend(model, slots=4, context_tokens=32), graphs=False, shortest=8)
    eager = EagerBackend(model, slots=4, context_tokens=32)
    assert graphs.lengths == [8, 16, 32]
    for slot in range(4):
        graphs.prefill(slot, PROMPTS[slot][:5])
        eager.prefill(slot, PROMPTS[slot][:5])
    cache = graphs.eager_backend.cache
    graphs.decode([0, 1, 2, 3], [1, 2, 3, 4], [5, 5, 5, 5])
    row3 = {layer: keys[3, :, :6].clone() for layer, keys in cache.keys.items()}
    # slots 0 and 2 left: slot 3 moves into row 0, slot 1 stays in row 1; 2 rows, bucket 2, no pad
    got = graphs.decode([1, 3], [7, 8], [6, 6])
    assert graphs.rows.row_of == {1: 1, 3: 0}
    assert graphs.buckets[2, 8].inputs.tolist() == [[8, 7], [6, 6]]  # in row order: slot 3's first
    for layer, keys in cache.keys.items():
        torch.testing.assert_close(keys[0, :, :6], row3[layer])  # slot 3's six tokens so far, moved
    eager.decode([0, 1, 2, 3], [1, 2, 3, 4], [5, 5, 5, 5])
    torch.testing.assert_close(got, eager.decode([1, 3], [7, 8], [6, 6]), rtol=1e-5, atol=1e-5)  # engine order
    graphs.decode([1, 3], [9, 9], [7, 7])
    graphs.prefill(0, PROMPTS[4][:3])  # a newcomer takes the lowest free row: row 2
    assert graphs.rows.row_of[0] == 2
    before = {layer: keys.clone() for layer, keys in cache.keys.items()}
    # 3 rows: bucket 4, one pad row, into row 3; position 8 is the ninth: context bucket 16
    graphs.decode([0, 1, 3], [1, 1, 1], [3, 8, 8])
    assert graphs.buckets[4, 16].inputs.tolist() == [[1, 1, 1, 0], [8, 8, 3, 31]]
    for layer, keys in cache.keys.items():
        changed = (keys != before[layer]).any(dim=(1, 3))  # (rows, positions) written
        # the pad row: row 3, which no running request holds, at the context's last position, which no request writes
        assert changed[3].nonzero().flatten().tolist() == [31]
        assert [changed[r].nonzero().flatten().tolist() for r in range(3)] == [[8], [8], [3]]


def test_rows_keep_the_running_slots_first_with_the_fewest_moves():
    rows = Rows(4)
    assert [rows.take(s) for s in (0, 1, 2, 3)] == [0, 1, 2, 3]
    assert rows.compact([0, 1, 2, 3]) == []
    assert rows.compact([1, 3]) == [(3, 3, 0)]  # 0 and 2 left: 3 moves down, 1 stays
    assert rows.row_of == {1: 1, 3: 0}
    assert rows.take(2) == 2 and rows.take(1) == 1  # a newcomer gets the lowest free row; a slot keeps its own
    assert rows.compact([1, 2, 3]) == []
    assert rows.compact([2]) == [(2, 2, 0)]


def test_batch_and_context_buckets_are_doublings_and_their_end_and_a_step_takes_the_smallest_that_holds_it():
    assert lengths(2048) == [128, 256, 512, 1024, 2048]
    assert lengths(100) == [100] and lengths(128) == [128] and lengths(129) == [128, 129]
    assert lengths(40, shortest=8) == [8, 16, 32, 40]
    assert [bucket_for(position + 1, lengths(40, 8)) for position in (0, 7, 8, 31, 32, 39)] == [8, 8, 16, 32, 40, 40]
    assert buckets(1) == [1]
    assert buckets(4) == [1, 2, 4]
    assert buckets(6) == [1, 2, 4, 6]
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert [bucket_for(n, buckets(6)) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    with pytest.raises(ValueError, match="more than the largest bucket, 6"):
        bucket_for(7, buckets(6))
    assert padded([5], [9], 2, 31) == [[5, 0], [9, 31]]


@pytest.mark.parametrize("kind", KINDS)
def test_the_engine_over_the_cpu_twin_gives_the_tokens_of_generate(kind):
    model = tiny_causal_lm(kind)
    progress = []
    backend = GraphBackend(EagerBackend(model, slots=3, context_tokens=64),
                           progress=lambda done, what: progress.append((done, what)), graphs=False, shortest=16)
    # largest first: the others reuse its memory on a GPU
    assert progress == [(n + 1, f"batch bucket {size}, context {length}")
                        for n, (size, length) in enumerate((s, c) for s in (3, 2, 1) for c in (64, 32, 16))]
    replayed, original = set(), backend.eager_backend.forward

    def forward(ids, rows, positions, length):
        if rows is None:  # a bucket's graph-safe forward: what a GPU replays
            replayed.add(length)
        return original(ids, rows, positions, length)

    backend.eager_backend.forward = forward
    engine = Engine(backend, max_queue=16)
    lengths = [12, 5, 9, 16, 3, 7]  # batches of 3, 2 and 1 rows: every bucket, padded and not
    got = [[] for _ in lengths]
    for prompt, n, tokens in zip(PROMPTS, lengths, got):
        engine.submit(prompt, n, frozenset(), Sampling(temperature=0.0),
                      lambda token, finish, tokens=tokens: tokens.append(token))
    while engine.step():
        pass
    for prompt, n, tokens in zip(PROMPTS, lengths, got):
        assert tokens == reference(model, prompt, n, eos=False), prompt
    assert replayed == {16, 32}, "the steps crossed from one context bucket into the next"
