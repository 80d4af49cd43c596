"""Request generators: fixed offline batches, and a seeded Poisson online stream.

Both yield plain ``Request`` records (no torch): prompt token ids, how many tokens to generate,
and an arrival time in seconds from the start of the run (0 for offline batches). Randomness comes
from a ``random.Random`` seeded by the caller, so a seed names a workload exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kernelfleet.errors import UsageError

LengthDist = Callable[[random.Random], int]
"""Draws one length from the generator it is given (see ``fixed``, ``uniform``, ``choice``)."""


@dataclass(frozen=True)
class Request:
    request_id: int
    arrival_seconds: float
    prompt: tuple[int, ...]
    output_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)


def fixed(n: int) -> LengthDist:
    """Always ``n``."""
    return lambda rng: n


def uniform(low: int, high: int) -> LengthDist:
    """Uniform integer in [low, high]."""
    return lambda rng: rng.randint(low, high)


def choice(lengths: list[int], weights: list[float] | None = None) -> LengthDist:
    """One of ``lengths`` (e.g. the lengths of a recorded trace), optionally weighted."""
    return lambda rng: rng.choices(lengths, weights)[0]


def _prompt(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab_size) for _ in range(length))


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise UsageError(f"{name} must be > 0, got {value!r}")


def offline_batches(n_batches: int, batch_size: int, prompt_len: int, output_len: int, vocab_size: int,
                    seed: int = 0) -> Iterator[list[Request]]:
    """``n_batches`` lists of ``batch_size`` requests, all with the same prompt and output lengths.

    Every request arrives at time 0: an offline (throughput) run drains them back to back.
    """
    _check_positive(n_batches=n_batches, batch_size=batch_size, prompt_len=prompt_len,
                    output_len=output_len, vocab_size=vocab_size)
    rng = random.Random(seed)
    for b in range(n_batches):
        yield [Request(b * batch_size + i, 0.0, _prompt(rng, prompt_len, vocab_size), output_len)
               for i in range(batch_size)]


def poisson_requests(rate_per_second: float, n_requests: int, prompt_len: LengthDist, output_len: LengthDist,
                     vocab_size: int, seed: int = 0) -> Iterator[Request]:
    """``n_requests`` arrivals of a Poisson process of rate λ = ``rate_per_second``.

    Inter-arrival gaps are exponential with mean 1/λ; prompt and output lengths are drawn from
    the given distributions. Lengths below 1 are misuse of the distribution and raise.
    """
    _check_positive(rate_per_second=rate_per_second, n_requests=n_requests, vocab_size=vocab_size)
    rng = random.Random(seed)
    now = 0.0
    for i in range(n_requests):
        now += rng.expovariate(rate_per_second)
        n_prompt, n_out = prompt_len(rng), output_len(rng)
        if n_prompt < 1 or n_out < 1:
            raise UsageError(f"lengths must be >= 1, the distributions gave prompt {n_prompt}, "
                             f"output {n_out}")
        yield Request(i, now, _prompt(rng, n_prompt, vocab_size), n_out)
