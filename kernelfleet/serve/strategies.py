"""Where the engine's slots lie: one device, request distribution, prefill on one device and decode on another, or the layers cut over devices.

A :class:`Strategy` is the engine's view of its devices. The engine's slots are the decode
backends' slots laid end to end (backend 0's first, then backend 1's, ...); each step the engine
runs every waiting request's prefill where the strategy says, then one decode call per backend
over the rows running there (all launched before any result is read, so GPUs run side by side).

* ``single``: one backend, what ``kernelfleet serve`` has always run.
* ``replicas`` (request distribution): every backend holds the whole model and its own slots; a
  request gets a slot on one of them and stays there. A newcomer goes to the backend whose slots
  are least full (running ÷ slots), so the load follows each device's share of the slots, which
  ``memory.proportional_slots`` makes proportional to its memory.
* ``split`` (prefill/decode split): prompts run on the first backend (its staging slots: one a
  prompt of a batched prefill, ``--prefill-batch``; a prompt's chunks run one prompt at a time in
  its first, ``engine.py``), then, after its prefill (its last chunk), the
  request's keys and values are handed over to its slot on the
  second (``Backend.adopt``; between GPUs a device-to-device copy of the row's positions so far),
  and it decodes there. The first backend never decodes, the second never prefills.

* ``pipeline`` (layer pipeline, ``pipeline.py``): the layers are cut into stages, one a device;
  every backend is a micro-batch group of slots running through all the stages, so the engine's
  launching every backend's decode before reading any keeps the stages busy side by side. A
  newcomer goes to the least full group.

kernelfleet's plans are a backend rather than a strategy over several (``placed.py``: one
backend whose every decode step runs one plan graph across the devices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kernelfleet.errors import UsageError
from kernelfleet.serve.backend import Backend

STRATEGIES = ("single", "replicas", "split", "pipeline")
STAGE_SLOT = 0  # the prefill backend's slot under ``split`` for a prompt prefilled alone


@dataclass(eq=False)
class Strategy:
    """``backends`` decode (their slots are the engine's, in order); ``prefill_on`` prefills every
    prompt where it is set (``split``), else each request prefills on its own backend."""

    name: str
    backends: list[Backend]
    prefill_on: Backend | None = None
    first_slots: list[int] = field(init=False)

    def __post_init__(self) -> None:
        contexts = {b.context_tokens for b in [*self.backends, *filter(None, [self.prefill_on])]}
        if len(contexts) != 1:
            raise ValueError(f"the backends of one strategy need one context length, got {sorted(contexts)}")
        self.first_slots, first = [], 0
        for backend in self.backends:
            self.first_slots.append(first)
            first += backend.slots

    @property
    def slots(self) -> int:
        return sum(b.slots for b in self.backends)

    @property
    def context_tokens(self) -> int:
        return self.backends[0].context_tokens

    def locate(self, slot: int) -> tuple[int, int]:
        """The decode backend of the engine's ``slot`` (its index) and the slot's number there."""
        index = max(i for i, first in enumerate(self.first_slots) if first <= slot)
        return index, slot - self.first_slots[index]

    def choose(self, free: list[int], running: Mapping[int, object]) -> int:
        """Which of the ``free`` slots (its index in the list) a newcomer takes: one on the backend
        whose slots are least full, the most recently freed there (its row is the likeliest to be in place)."""
        busy = [0] * len(self.backends)
        for slot in running:
            busy[self.locate(slot)[0]] += 1
        fullness = [busy[i] / b.slots for i, b in enumerate(self.backends)]
        best = min({self.locate(slot)[0] for slot in free}, key=lambda i: (fullness[i], i))
        return max(i for i, slot in enumerate(free) if self.locate(slot)[0] == best)


def checked_strategy(strategy: str, names: list[str | None]) -> None:
    """UsageError unless ``strategy`` is known and the ``--device`` list (``names``) fits it."""
    if strategy not in STRATEGIES:
        raise UsageError(f"--strategy takes {', '.join(STRATEGIES)}, got {strategy!r}")
    count = len(names)
    if strategy == "single" and count > 1:
        raise UsageError(f"--strategy single serves on one --device, got {count}: pass --strategy replicas or split")
    if strategy == "replicas" and count < 2:
        raise UsageError(f"--strategy replicas distributes requests over two or more --device, got {count}")
    if strategy == "pipeline" and count < 2:
        raise UsageError(f"--strategy pipeline cuts the layers into one stage a --device: it takes two or more, got {count}")
    if strategy == "split" and count != 2:
        raise UsageError(f"--strategy split takes two --device, the prefill's then the decode's, got {count}")
    if len(set(names)) != count:
        raise UsageError(f"--device names must differ (each names a device in the metrics), got "
                         f"{', '.join(map(str, names))}")


def single(backend: Backend) -> Strategy:
    return Strategy("single", [backend])


def replicas(backends: list[Backend]) -> Strategy:
    checked_strategy("replicas", [b.device for b in backends])
    return Strategy("replicas", backends)


def split(prefill: Backend, decode: Backend) -> Strategy:
    checked_strategy("split", [prefill.device, decode.device])
    return Strategy("split", [decode], prefill_on=prefill)


def pipeline(groups: list[Backend]) -> Strategy:
    """The layer pipeline over its micro-batch groups (each a ``pipeline.PipelineBackend`` over the same stages)."""
    return Strategy("pipeline", groups)
