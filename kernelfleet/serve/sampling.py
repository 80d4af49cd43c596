"""Choosing the next token from one request's logits: greedy, or seeded sampling.

Temperature 0 is greedy (the arg max, as transformers' ``generate(do_sample=False)``). Otherwise the
logits are divided by the temperature and, with ``top_p`` below 1, cut to the smallest set of
most likely tokens whose probabilities add up to at least ``top_p`` (nucleus sampling); the token
is drawn with the request's own generator, seeded from its seed, so a seed gives the same tokens
whatever else the server is running.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one request picks its tokens (checked by the API's request document)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


class Sampler:
    """One request's token chooser: its settings and, when it samples, its generator."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.generator = None
        if sampling.temperature > 0:
            self.generator = torch.Generator().manual_seed(sampling.seed)

    def choose(self, logits: torch.Tensor, greedy: int | None = None) -> int:
        """The next token of a 1-D row of logits (float32, on any device); ``greedy``, where the
        caller has it, is their arg max (read once for a whole batch)."""
        if self.generator is None:
            return int(logits.argmax()) if greedy is None else greedy
        probabilities = torch.softmax(logits.cpu() / self.sampling.temperature, dim=-1)
        if self.sampling.top_p < 1.0:
            ordered, order = probabilities.sort(descending=True)
            before = ordered.cumsum(0) - ordered  # probability of the more likely tokens than this one
            ordered[before >= self.sampling.top_p] = 0.0  # the most likely token always stays
            probabilities = torch.zeros_like(probabilities).scatter_(0, order, ordered)
        return int(torch.multinomial(probabilities, 1, generator=self.generator))
