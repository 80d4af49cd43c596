"""Streamed text, token by token, from a real byte-level tokenizer: a character of several bytes
spread over several tokens appears whole, once, in the chunk of its last byte."""

import pytest

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
