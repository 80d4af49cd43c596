"""The serving loop's strategies on the CPU, two CPU backends as the two devices: request
distribution (each request on one backend's slot, every backend stepped each decode step) and the
prefill/decode split (prefill on one, the slot's keys and values handed over, decode on the other)
give transformers' ``generate`` tokens for a dense and an MoE model with requests sharing the slots;
over HTTP, many interleaved requests each get their own; busy time is counted per device."""

import re

import httpx
import pytest
import torch
from recorded import PROMPTS, interleaved, reference, served_model, serving, stepped, tiny_causal_lm

from kernelfleet.errors import UsageError
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.command import Placed
from kernelfleet.serve.graphs import GraphBackend
from kernelfleet.serve.memory import proportional_slots
from kernelfleet.serve.strategies import checked_strategy, replicas, split

pytestmark = pytest.mark.unit
KINDS = ["llama", "qwen2-moe"]
LENGTHS = [12, 5, 9, 16, 3, 7]


def strategy_of(name, model):
    if name == "replicas":  # 2 slots and 1: the first takes two requests for the second's one
        return replicas([EagerBackend(model, 2, 64, "cpu0"), EagerBackend(model, 1, 64, "cpu1")])
    # prefill eagerly on cpu0; decode on cpu1 through the graph backend's CPU twin (its rows move too)
    return split(EagerBackend(model, 1, 64, "cpu0"), GraphBackend(EagerBackend(model, 3, 64), graphs=False,
                                                                  device_name="cpu1"))


@pytest.mark.parametrize("strategy", ["replicas", "split"])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_equal_generate_under_each_strategy(kind, strategy):
    model = tiny_causal_lm(kind)
    plan = strategy_of(strategy, model)
    assert plan.slots == 3
    got, where, busy = stepped(plan, PROMPTS, LENGTHS)
    for prompt, n, tokens in zip(PROMPTS, LENGTHS, got):
        assert tokens == reference(model, prompt, n, eos=False), prompt
    assert set(busy) == {"cpu0", "cpu1"} and all(seconds > 0 for seconds in busy.values())
    if strategy == "replicas":
        assert where[0] == [0, 0, 1]  # three requests at once: two on the backend of two slots, one on the other


def test_the_split_hands_over_the_keys_and_values_a_prefill_there_would_write():
    model = tiny_causal_lm("llama")
    direct = EagerBackend(model, 2, 32)
    plan = split(EagerBackend(model, 1, 32, "cpu0"), EagerBackend(model, 2, 32, "cpu1"))
    want = direct.prefill(1, PROMPTS[2])
    got = plan.prefill_on.prefill(0, PROMPTS[2])
    plan.backends[0].adopt(1, *plan.prefill_on.kv(0), len(PROMPTS[2]))
    torch.testing.assert_close(got, want)
    decoding = plan.backends[0].cache
    for layer in direct.cache.keys:
        torch.testing.assert_close(decoding.keys[layer][1, :, :7], direct.cache.keys[layer][1, :, :7])
        torch.testing.assert_close(decoding.values[layer][1, :, :7], direct.cache.values[layer][1, :, :7])
        assert not decoding.keys[layer][0].any()  # the other slot untouched


def test_a_newcomer_goes_to_the_least_full_backend():
    model = tiny_causal_lm("llama")
    plan = replicas([EagerBackend(model, 1, 16, "a"), EagerBackend(model, 3, 16, "b")])
    assert [plan.locate(s) for s in range(4)] == [(0, 0), (1, 0), (1, 1), (1, 2)]

    def picked(free, running):
        return free[plan.choose(free, running)]

    assert picked([3, 2, 1, 0], {}) == 0  # both empty: the first backend
    assert picked([3, 2, 1], {0: "x"}) == 1  # a is full: b, its most recently freed slot (last in the list)
    assert picked([3, 2, 0], {1: "x"}) == 0  # a at 0 of 1, b at 1 of 3: a
    assert picked([3, 2], {0: "x", 1: "x"}) == 2  # only b has room


def test_slots_split_in_proportion_to_memory_and_bad_strategies_are_one_line():
    assert proportional_slots(4, [1.0, 3.0]) == [1, 3]
    assert proportional_slots(8, [40.0, 80.0]) == [3, 5]
    assert proportional_slots(5, [1.0, 1.0]) == [3, 2]
    with pytest.raises(UsageError, match="--slots 1 cannot give each of the 2 devices a slot"):
        proportional_slots(1, [1.0, 1.0])
    for strategy, devices, says in [("ring", "ab", "--strategy takes single, replicas, split, pipeline, got 'ring'"),
                                    ("pipeline", "a", "it takes two or more, got 1"),
                                    ("replicas", "a", "over two or more --device, got 1"),
                                    ("split", "abc", "takes two --device, the prefill's then the decode's, got 3"),
                                    ("single", "ab", "serves on one --device, got 2")]:
        with pytest.raises(UsageError, match=re.escape(says)):
            checked_strategy(strategy, list(devices))
    model = tiny_causal_lm("llama")
    with pytest.raises(UsageError, match="--device names must differ"):
        replicas([EagerBackend(model, 1, 16, "a"), EagerBackend(model, 1, 16, "a")])


@pytest.mark.parametrize("strategy", ["replicas", "split"])
def test_many_interleaved_requests_over_http_each_get_their_own_tokens(strategy):
    """The bounded load test under a strategy: 24 clients, 8 at a time, half streaming, each decode
    device through the graph backend's twin with context buckets from 8 (positions reach 17)."""
    llama = tiny_causal_lm("llama")
    prompts = [[(11 * i + j) % 256 for j in range(1 + i % 7)] for i in range(24)]
    lengths = [2 + (3 * i) % 9 for i in range(24)]
    expected = [reference(llama, p, n, eos=False) for p, n in zip(prompts, lengths)]
    devices = [Placed("cpu0", llama, 1 if strategy == "split" else 2), Placed("cpu1", llama, 2)]


    with serving(served_model(llama), slots=4 if strategy == "replicas" else 2, max_queue=24, strategy=strategy,
                 devices=devices, graphs=True, shortest=8) as (url, engine):
        assert all(b.lengths == [8, 16, 32, 64, 128] for b in engine.strategy.backends)
        got = interleaved(url, prompts, lengths, 8)
        health = httpx.get(f"{url}/healthz").json()
        metrics = httpx.get(f"{url}/metrics").text
    assert got == expected
    assert health["slots"] == (4 if strategy == "replicas" else 2)
    for device in ("cpu0", "cpu1"):
        assert f'kernelfleet_serve_device_busy_seconds_total{{device="{device}"}}' in metrics
    assert 'kernelfleet_serve_requests_total{finish_reason="length"} 24.0' in metrics
