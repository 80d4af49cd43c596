"""The generation loop without HTTP: greedy tokens equal transformers' own ``generate`` for a
dense and an MoE model while requests of different lengths share the slots and join mid-way;
seeded sampling is reproducible; stop tokens, max_tokens, cancellation and a failing forward
free their slots."""

import pytest
import torch
from recorded import PROMPTS, reference, tiny_causal_lm

from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.engine import Closed, Engine
from kernelfleet.serve.sampling import Sampler, Sampling
from kernelfleet.serve.scheduler import QueueFull, Scheduler

pytestmark = pytest.mark.unit
GREEDY = Sampling(temperature=0.0)


class Collected:
    """A sink that keeps what the engine sends."""

    def __init__(self):
        self.tokens, self.finish = [], None

    def __call__(self, token, finish):
        if token is not None:
            self.tokens.append(token)
        self.finish = finish


def drain(engine, limit=10_000):
    for _ in range(limit):
        if not engine.step():
            return
    raise AssertionError("the loop did not finish")


def submit(engine, prompt, max_tokens, sampling=GREEDY, stop=frozenset()):
    sink = Collected()
    return engine.submit(prompt, max_tokens, stop, sampling, sink), sink


@pytest.mark.parametrize("kind", ["llama", "qwen2-moe"])
def test_greedy_tokens_equal_generate_while_requests_share_the_slots(kind):
    model = tiny_causal_lm(kind)
    engine = Engine(EagerBackend(model, slots=3, context_tokens=64), max_queue=16)
    lengths = [12, 5, 9, 16, 3, 7]  # requests leave at different steps; later ones take their slots
    sinks = [submit(engine, p, n)[1] for p, n in zip(PROMPTS, lengths)]
    drain(engine)
    for prompt, n, sink in zip(PROMPTS, lengths, sinks):
        assert sink.tokens == reference(model, prompt, n, eos=False), prompt
        assert sink.finish == "length"
    assert engine.scheduler.free and not engine.scheduler.running


def test_a_request_joins_at_the_next_step_and_its_tokens_do_not_change_those_of_others():
    model = tiny_causal_lm("llama")
    engine = Engine(EagerBackend(model, slots=2, context_tokens=64), max_queue=4)
    _, first = submit(engine, PROMPTS[0], 10)
    for _ in range(4):
        engine.step()
    assert len(first.tokens) == 5  # prefill gives one, each step's decode one more
    _, second = submit(engine, PROMPTS[1], 6)
    engine.step()
    assert len(first.tokens) == 6 and len(second.tokens) == 2
    drain(engine)
    assert first.tokens == reference(model, PROMPTS[0], 10, eos=False)
    assert second.tokens == reference(model, PROMPTS[1], 6, eos=False)


def test_the_models_end_token_and_stop_token_ids_stop_a_request_with_the_token_kept():
    model = tiny_causal_lm("llama")
    free = reference(model, PROMPTS[0], 12, eos=False)
    engine = Engine(EagerBackend(model, slots=2, context_tokens=64), max_queue=4)
    _, stopped = submit(engine, PROMPTS[0], 12, stop=frozenset({free[3]}))
    drain(engine)
    assert stopped.tokens == free[:free.index(free[3]) + 1] and stopped.finish == "stop"


def test_seeded_sampling_gives_the_same_tokens_alone_or_beside_others():
    model = tiny_causal_lm("llama")
    hot = Sampling(temperature=1.0, top_p=0.9, seed=1234)
    engine = Engine(EagerBackend(model, slots=4, context_tokens=64), max_queue=8)
    _, alone = submit(engine, PROMPTS[2], 20, hot)
    drain(engine)
    _, crowded = submit(engine, PROMPTS[2], 20, hot)
    _, other_seed = submit(engine, PROMPTS[2], 20, Sampling(temperature=1.0, top_p=0.9, seed=99))
    for prompt in PROMPTS[:2]:
        submit(engine, prompt, 20, Sampling(temperature=1.0, seed=7))
    drain(engine)
    assert crowded.tokens == alone.tokens and len(alone.tokens) == 20
    assert other_seed.tokens != alone.tokens
    assert alone.tokens != reference(model, PROMPTS[2], 20, eos=False)  # it did sample


def test_top_p_keeps_the_smallest_set_of_likely_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    drawn = {Sampler(Sampling(temperature=1.0, top_p=0.8, seed=s)).choose(logits) for s in range(200)}
    assert drawn == {0, 1}  # 0.5 + 0.3 reach 0.8: the two least likely are cut
    assert {Sampler(Sampling(temperature=1.0, top_p=0.01, seed=s)).choose(logits) for s in range(50)} == {0}
    assert Sampler(Sampling(temperature=0.0)).choose(logits) == 0


def test_the_queue_holds_max_queue_beyond_the_free_slots():
    scheduler = Scheduler(slots=2, max_queue=1)
    for item in "abc":
        scheduler.submit(item)
    with pytest.raises(QueueFull, match="the queue is full"):
        scheduler.submit("d")
    assert scheduler.admit() == [(0, "a"), (1, "b")]
    with pytest.raises(QueueFull):  # c waits and no slot is free
        scheduler.submit("d")
    scheduler.release(1)
    assert scheduler.admit() == [(1, "c")]  # the freed slot is reused, oldest first
    scheduler.submit("d")
    assert scheduler.withdraw("d") and not scheduler.withdraw("d")


def test_a_cancelled_request_leaves_its_slot_at_the_next_step():
    model = tiny_causal_lm("llama")
    engine = Engine(EagerBackend(model, slots=1, context_tokens=64), max_queue=4)
    request, gone = submit(engine, PROMPTS[0], 40)
    _, waiting = submit(engine, PROMPTS[1], 5)
    engine.step()
    engine.cancel(request)
    drain(engine)
    assert len(gone.tokens) == 2 and gone.finish is None  # nobody listens: nothing more is sent
    assert waiting.tokens == reference(model, PROMPTS[1], 5, eos=False)
    queued, never = submit(engine, PROMPTS[1], 5)
    engine.cancel(queued)
    assert not engine.step() and never.tokens == []
    text = engine.metrics.exposition().decode()
    assert 'kernelfleet_serve_requests_total{finish_reason="cancelled"} 2.0' in text


def test_a_failing_forward_ends_its_requests_with_an_error_and_the_loop_goes_on():
    model = tiny_causal_lm("llama")
    backend = EagerBackend(model, slots=2, context_tokens=64)
    engine = Engine(backend, max_queue=4)
    decode = backend.decode
    backend.decode = lambda *args: (_ for _ in ()).throw(RuntimeError("device lost"))
    _, failed = submit(engine, PROMPTS[0], 5)
    engine.step()
    assert failed.finish == "error" and len(failed.tokens) == 1 and not engine.scheduler.running
    backend.decode = decode
    _, fine = submit(engine, PROMPTS[0], 5)
    drain(engine)
    assert fine.tokens == reference(model, PROMPTS[0], 5, eos=False)


def test_logits_that_cannot_be_sampled_end_only_their_request():
    model = tiny_causal_lm("llama")
    backend = EagerBackend(model, slots=2, context_tokens=64)
    engine = Engine(backend, max_queue=4)
    _, fine = submit(engine, PROMPTS[0], 4)
    _, broken = submit(engine, PROMPTS[1], 4, Sampling(temperature=1.0, seed=1))
    decode = backend.decode

    def poisoned(slots, tokens, positions):
        logits = decode(slots, tokens, positions).clone()
        if 1 in slots:
            logits[slots.index(1)] = float("nan")
        return logits

    backend.decode = poisoned
    drain(engine)
    assert broken.finish == "error" and len(broken.tokens) == 1
    assert fine.tokens == reference(model, PROMPTS[0], 4, eos=False)


def test_a_failing_loop_ends_every_request_and_takes_no_more():
    engine = Engine(EagerBackend(tiny_causal_lm("llama"), slots=1, context_tokens=64), max_queue=4)
    engine._next = lambda *args: (_ for _ in ()).throw(ValueError("a bug"))
    sinks = [submit(engine, prompt, 4)[1] for prompt in PROMPTS[:3]]
    engine.start()._thread.join(timeout=60)
    assert not engine.alive() and [s.finish for s in sinks] == ["error"] * 3
    with pytest.raises(Closed, match="the generation loop has stopped"):
        submit(engine, PROMPTS[0], 4)


def test_a_request_is_counted_finished_before_its_client_gets_the_last_token():
    """A client that reads /metrics once it has its answer sees its request among the finished ones
    (CI once read the count before the loop had added it)."""
    engine = Engine(EagerBackend(tiny_causal_lm("llama"), slots=1, context_tokens=64), max_queue=4)
    seen = []

    def sink(token, finish):
        if finish is not None:
            counted = f'kernelfleet_serve_requests_total{{finish_reason="{finish}"}} 1.0' in \
                engine.metrics.exposition().decode()
            seen.append((finish, counted, engine.scheduler.free[:]))

    engine.submit(PROMPTS[0], 3, frozenset(), GREEDY, sink)
    drain(engine)
    assert seen == [("length", True, [0])]  # counted, and its slot free, as the last token leaves
