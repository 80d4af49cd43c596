"""OpenAI's ``stop`` strings and ``n`` choices, over real HTTP on a tiny Llama with a real tokenizer.

A stop string ends a choice where its text first holds it (the text cut before it, streamed or
whole, a held piece never sent); ``n`` choices each equal the single request of their seed."""

import asyncio
import random

import httpx
import pytest
from recorded import complete, reference, served_model, serving, streamed, tiny_causal_lm, word_tokenizer

from kernelfleet.serve.stops import StopText

pytestmark = pytest.mark.unit
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def llama():
    return tiny_causal_lm("llama")


@pytest.fixture(scope="module")
def words():
    return word_tokenizer()


def test_stop_text_ends_at_the_first_stop_and_never_sends_a_held_piece(words):
    """A random walk of word tokens and stops cut from it: the pieces add up to the text before
    the first stop, found at the token that completes it."""
    rng = random.Random(3)
    for _ in range(200):
        tokens = [rng.randrange(20) for _ in range(12)]
        full = words.decode(tokens)
        start = rng.randrange(len(full))
        stops = [full[start:start + rng.randint(1, 8)], "never here"]
        watch = StopText(words, stops)
        found_at = next(i for i, token in enumerate(tokens) if watch(token, i == len(tokens) - 1) or watch.found)
        cut = min(at for at in (full.find(stop) for stop in stops) if at >= 0)
        assert watch.whole() == full[:cut]
        assert stops[0] in words.decode(tokens[:found_at + 1]) and stops[0] not in words.decode(tokens[:found_at])
        sent = ""
        for piece in watch.pieces:  # every piece, once out, stays part of the answer
            sent += piece
            assert full[:cut].startswith(sent)


def test_without_a_stop_the_last_token_sends_what_was_held(words):
    watch = StopText(words, ["w1 w2 w3"])
    assert [watch(1, False), watch(2, False)] == [False, False] and watch.pieces == ["", ""]  # "w1 w2" may begin it
    assert watch(4, True) is False and watch.whole() == "w1 w2 w4"


def test_a_stop_string_ends_the_choice_where_its_text_holds_it(llama, words):
    prompt, total = [5, 9, 100, 3], 12
    tokens = reference(llama, prompt, total, eos=False)
    full = words.decode(tokens)
    stop = words.decode(tokens[5:7])  # two tokens' words: the string spans tokens
    cut = full.find(stop)
    ends = next(k for k in range(1, total + 1) if stop in words.decode(tokens[:k]))

    async def both(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"prompt": prompt, "max_tokens": total, "stop": [stop, "w999"], **GREEDY}
            return await complete(client, **body), await streamed(client, **body)

    with serving(served_model(llama, tokenizer=words)) as (url, engine):
        whole, chunks = asyncio.run(both(url))
        metrics = engine.metrics.exposition().decode()
    (choice,) = whole["choices"]
    assert choice["text"] == full[:cut] and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == tokens[:ends] and whole["usage"]["completion_tokens"] == ends
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[:cut]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == tokens[:ends]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert 'kernelfleet_serve_requests_total{finish_reason="stop"} 2.0' in metrics
    assert f"kernelfleet_serve_generated_tokens_total {2.0 * ends}" in metrics  # no token past the stop


def test_n_choices_each_equal_the_request_of_their_seed(llama, words):
    prompt, sampling = [1, 2, 3, 4, 5, 6, 7], {"temperature": 0.9, "seed": 11, "ignore_eos": True}

    async def scenario(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            three = await complete(client, prompt=prompt, max_tokens=6, n=3, **sampling)
            singles = [await complete(client, prompt=prompt, max_tokens=6, **{**sampling, "seed": 11 + i})
                       for i in range(3)]
            chunks = await streamed(client, prompt=prompt, max_tokens=6, n=3, **sampling)
            greedy = await complete(client, prompt=prompt, max_tokens=6, n=2, **GREEDY)
            return three, singles, chunks, greedy

    with serving(served_model(llama, tokenizer=words), slots=2) as (url, _):
        three, singles, chunks, greedy = asyncio.run(scenario(url))
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in three["choices"]] == [s["choices"][0]["token_ids"] for s in singles]
    assert [c["text"] for c in three["choices"]] == [s["choices"][0]["text"] for s in singles]
    assert len({tuple(c["token_ids"]) for c in three["choices"]}) > 1  # different seeds, different samples
    assert three["usage"] == {"prompt_tokens": 7, "completion_tokens": 18, "total_tokens": 25}
    by_index = {i: [t for c in chunks for t in c["choices"][0]["token_ids"] if c["choices"][0]["index"] == i]
                for i in range(3)}
    assert [by_index[i] for i in range(3)] == [c["token_ids"] for c in three["choices"]]
    assert [c["token_ids"] for c in greedy["choices"]] == [reference(llama, prompt, 6, eos=False)] * 2


@pytest.mark.parametrize(("body", "tokenizer", "says"), [
    ({"prompt": [1, 2], "stop": "w3"}, False, "stop: tiny has no tokenizer in its directory"),
    ({"prompt": [1, 2], "stop": ["a", "b", "c", "d", "e"]}, True, "stop"),
    ({"prompt": [1, 2], "stop": ""}, True, "stop"),
    ({"prompt": [1, 2], "n": 0}, True, "n: Input should be greater than or equal to 1"),
    ({"prompt": [1, 2], "n": 129}, True, "n: Input should be less than or equal to 128"),
])
def test_bad_stop_or_n_is_one_line(llama, words, body, tokenizer, says):
    with serving(served_model(llama, tokenizer=words if tokenizer else None)) as (url, _):
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert says in message and "\n" not in message


def test_a_completion_whose_choices_do_not_fit_the_queue_is_refused_whole(llama):
    with serving(served_model(llama), slots=1, max_queue=2) as (url, engine):
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "n": 4, "max_tokens": 50, **GREEDY},
                            timeout=30)
        after = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, **GREEDY}, timeout=30)
        metrics = engine.metrics.exposition().decode()
    assert answer.status_code == 429 and after.status_code == 200
    assert "kernelfleet_serve_rejected_requests_total 1.0" in metrics
    assert 'kernelfleet_serve_requests_total{finish_reason="length"} 1.0' in metrics  # none of the four ran to its end
