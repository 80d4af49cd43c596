"""Hostile PTX: every mutant of the committed PTX either analyses or fails in one UsageError line.

The corpus is the committed PTX (tests/data/ptx) under seeded mutations — a character cut, a line
doubled or dropped, tokens swapped, punctuation or out-of-range numbers inserted, the file cut
short — plus the mutants that once raised something else (``REGRESSIONS``: a campaign of 9,000
mutants found 21 tracebacks of 8 kinds before the parser and the analysis checked them). The
parser, the static analysis and the range-probe rewriter all run on every mutant.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.ptx import analyze, parse
from kernelfleet.ptx.probe import instrument

pytestmark = pytest.mark.unit

PTX = sorted((Path(__file__).parents[1] / "data" / "ptx").rglob("*.ptx"))
INSERTS = ("[", "]", "+", "-", "0x", ".align", "{", "}", ";", "%", ",", "99999999999999999999", "<", ">",
           "\x00", "-1", ".param", "1e400")
NUMBERS = ("", "-5", "0", "x", "1e999", "999999999999999999999999")


def mutate(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    op = rng.randrange(7)
    if op == 0:
        return text[:rng.randrange(len(text))]
    if op == 1:
        i = rng.randrange(len(text))
        return text[:i] + text[i + 1:]
    if op == 2:
        i = rng.randrange(len(lines))
        return "\n".join(lines[:i] + [lines[i]] + lines[i:])
    if op == 3:
        i = rng.randrange(len(lines))
        return "\n".join(lines[:i] + lines[i + 1:])
    if op == 4:
        i = rng.randrange(len(text))
        return text[:i] + rng.choice(INSERTS) + text[i:]
    if op == 5:
        numbers = list(re.finditer(r"\d+", text))
        if not numbers:
            return text + "1"
        m = rng.choice(numbers)
        return text[:m.start()] + rng.choice(NUMBERS) + text[m.end():]
    words = text.split(" ")
    i, j = rng.randrange(len(words)), rng.randrange(len(words))
    words[i], words[j] = words[j], words[i]
    return " ".join(words)


def corpus(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = [p.read_text() for p in PTX]
    out = []
    for _ in range(count):
        text = mutate(rng.choice(texts), rng)
        for _ in range(rng.randrange(3)):
            text = mutate(text, rng) if text else text
        out.append(text)
    return out


def outcome(text: str) -> str:
    """"ok", or the one-line message of the UsageError; anything else propagates and fails."""
    try:
        module = parse(text)
        analyze(module)
        for entry in module.entries:
            instrument(text, entry.name)
    except UsageError as exc:
        message = str(exc)
        assert "\n" not in message.strip() and message, repr(message)
        return message
    return "ok"


def _saxpy() -> str:
    return (Path(__file__).parents[1] / "data" / "ptx" / "saxpy_nvcc.ptx").read_text()


REGRESSIONS = {  # (what broke, the mutant) -> a substring of the one line it now gives
    "an array sized by a register": (lambda t: t.replace(".param .u64 _Z5saxpyifPKfPf_param_2", ".param .b8 p[%rd1]", 1),
                                     "array size must be"),
    "an offset that is a float": (lambda t: t.replace("[%rd6]", "[%rd6+1e400]", 1), "bad address offset"),
    "an .align with a word": (lambda t: t.replace(".param .u64", ".param .align spare .u64", 1), ".align must be"),
    "an array of a word": (lambda t: t.replace(".param .u64 _Z5saxpyifPKfPf_param_2", ".param .b8 p[x]", 1),
                           "array size must be"),
    "a .pred array": (lambda t: t.replace(".param .u64 _Z5saxpyifPKfPf_param_2", ".param .pred p[2]", 1),
                      "cannot be an array"),
    "a load without its address": (lambda t: re.sub(r"ld\.global\.f32 \t%f\d+, \[%rd\d+\];", "ld.global.f32 %f9;", t, 1),
                                   "needs an address and a value"),
    "a store without its value": (lambda t: re.sub(r"st\.global\.f32 \t\[%rd\d+\], %f\d+;", "st.global.f32 [%rd7];", t, 1),
                                  "needs an address and a value"),
    "an empty file": (lambda t: "", "no .entry kernel"),
    "a header alone": (lambda t: t.split(".visible")[0], "no .entry kernel"),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_each_mutant_that_once_raised_a_traceback_now_gives_one_line(name):
    make, expected = REGRESSIONS[name]
    mutant = make(_saxpy())
    assert mutant != _saxpy() or name == "an empty file"
    assert expected in outcome(mutant)


@pytest.mark.parametrize("seed", range(3))
def test_seeded_mutants_of_every_committed_ptx_analyse_or_fail_in_one_line(seed):
    results = [outcome(text) for text in corpus(seed, 500)]
    assert len(results) == 500
    assert 0 < results.count("ok") < 500  # the corpus holds both: mutants that still parse, and not
