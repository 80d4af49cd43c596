"""Streamed text, token by token, from a real byte-level tokenizer: a character of several bytes
spread over several tokens appears whole, once, in the chunk of its last byte."""

import pytest
from recorded import word_tokenizer

from kernelfleet.serve.stream import REPLACEMENT, Detokenizer

pytestmark = pytest.mark.unit


def byte_tokenizer():
    """A byte-level BPE with no merges: one token per byte, so 'é' is two tokens and '日' three."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.BPE())
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words.decoder = decoders.ByteLevel()
    words.train_from_iterator([""], trainers.BpeTrainer(vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=words)


def test_a_character_split_over_tokens_is_sent_whole_with_its_last_byte():
    tokenizer = byte_tokenizer()
    text = "café 日本"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.encode())  # one token a byte: the multi-byte characters are split
    stream = Detokenizer(tokenizer)
    pieces = [stream.add(token, i == len(ids) - 1) for i, token in enumerate(ids)]
    assert "".join(pieces) == text and not any(REPLACEMENT in p for p in pieces)
    assert pieces[3:5] == ["", "é"] and pieces[6:9] == ["", "", "日"]


def test_without_a_tokenizer_there_is_no_text():
    assert Detokenizer(None).add(5, True) is None


class Recording:
    """A real tokenizer that keeps how many tokens each decode call was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.lengths = tokenizer, []

    def decode(self, tokens, **options):
        self.lengths.append(len(tokens))
        return self.tokenizer.decode(tokens, **options)


def test_each_token_decodes_a_window_of_the_last_tokens_not_the_whole_text():
    words = Recording(word_tokenizer())
    ids = [(7 * i) % 255 for i in range(400)]
    stream = Detokenizer(words)
    pieces = [stream.add(token, i == len(ids) - 1) for i, token in enumerate(ids)]
    assert "".join(pieces) == words.tokenizer.decode(ids) and pieces[1] == " w7"
    assert max(words.lengths) == 2  # the token before it (for its space) and itself, however long the answer


def test_the_outbox_wakes_the_loop_once_for_what_a_step_put_and_keeps_each_streams_order():
    import asyncio
    import threading

    from kernelfleet.serve.stream import Outbox, TokenStream

    class CountingLoop(asyncio.SelectorEventLoop):
        wakes = 0

        def call_soon_threadsafe(self, *args, **kwargs):
            CountingLoop.wakes += 1
            return super().call_soon_threadsafe(*args, **kwargs)

    async def scenario():
        outbox = Outbox(asyncio.get_running_loop())
        streams = [TokenStream(outbox) for _ in range(3)]

        def step():  # the engine's thread: one decode step of three requests, ten times, the loop not running
            for token in range(10):
                for stream in streams:
                    stream(token, "length" if token == 9 else None)

        engine = threading.Thread(target=step)
        engine.start()
        engine.join()
        wakes = CountingLoop.wakes
        got = [[token async for token, _ in stream] for stream in streams]
        return wakes, got

    loop = CountingLoop()
    try:
        wakes, got = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert wakes == 1  # thirty tokens put while the loop was busy: one wake took them all
    assert got == [list(range(10))] * 3
