"""Which request runs in which KV-cache slot: a bounded FIFO queue and a pool of free slots.

Plain data, no torch and no clock: the engine asks it, each step, which waiting requests move
into the slots that are free (:meth:`Scheduler.admit`), and tells it when a request leaves its
slot (:meth:`Scheduler.release`), so a slot is reused by the next request at the next step.
A request that finds no free slot and ``max_queue`` requests already waiting for one is refused
(:class:`QueueFull`; the API answers 429).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from kernelfleet.errors import KernelfleetError

Item = TypeVar("Item")
# ``--prefill-chunk``'s default, the prompt tokens the engine prefills a step at most (engine.py): 0,
# whole prompts. Measured on an H200 (docs/validation/serve-gpu.md, `bench.serve_gpu --cases capped
# --prefill-chunk 0,128,256`), chunks of 128 or 256 made both strategies of the memory-capped pair
# slower at every load (p99 time per output token 67-171 ms against 47-77 ms whole): a chunk runs
# eagerly, launch-bound, as long as a whole short prompt, and one part-prefilled prompt at a time
# admits newcomers slower than they arrive. Chunks pay once they run as graphs, beside the decode.
DEFAULT_PREFILL_CHUNK_TOKENS = 0


class QueueFull(KernelfleetError):
    """More requests wait than the queue holds."""


class Scheduler(Generic[Item]):
    """``slots`` slots (0 .. slots-1) and a queue of at most ``max_queue`` waiting requests."""

    def __init__(self, slots: int, max_queue: int,
                 choose: Callable[[list[int], dict[int, Item]], int] | None = None) -> None:
        self.free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first
        self.max_queue = max_queue
        # which free slot (its index in ``free``) a newcomer takes, given those running; by default
        # the most recently freed (``strategies.py`` balances devices instead)
        self.choose = choose or (lambda free, running: len(free) - 1)
        self.waiting: deque[Item] = deque()
        self.running: dict[int, Item] = {}

    def submit(self, item: Item) -> None:
        # a free slot takes a request at the next step whatever the queue holds: only the rest waits
        if len(self.waiting) >= self.max_queue + len(self.free):
            raise QueueFull(f"the queue is full ({self.max_queue} requests wait for a slot); retry later")
        self.waiting.append(item)

    def withdraw(self, item: Item) -> bool:
        """Take a request out of the queue before it got a slot; False when it is not waiting."""
        try:
            self.waiting.remove(item)
        except ValueError:
            return False
        return True

    def admit(self, most: int | None = None) -> list[tuple[int, Item]]:
        """Waiting requests moved into free slots, oldest first, at most ``most`` of them (None: as
        many as there are free slots): ``(slot, request)`` pairs."""
        admitted = []
        while self.waiting and self.free and (most is None or len(admitted) < most):
            slot = self.free.pop(self.choose(self.free, self.running))
            self.running[slot] = item = self.waiting.popleft()
            admitted.append((slot, item))
        return admitted

    def release(self, slot: int) -> None:
        """The request in ``slot`` is done; the slot takes the next one."""
        del self.running[slot]
        self.free.append(slot)

    def drain(self) -> list[Item]:
        """Every waiting request, taken out of the queue (the loop is stopping)."""
        drained = list(self.waiting)
        self.waiting.clear()
        return drained
