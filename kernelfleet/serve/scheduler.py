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

from kernelfleet.errors import KernelfleetError, UsageError

Item = TypeVar("Item")
# ``--prefill-chunk``'s default, the prompt tokens the engine prefills a step at most (engine.py): 0,
# whole prompts. Measured on an H200 (docs/validation/serve-gpu.md, `bench.serve_gpu --cases capped
# --prefill-chunk 0,128,256`), chunks of 128 or 256 made both strategies of the memory-capped pair
# slower at every load (p99 time per output token 67-171 ms against 47-77 ms whole): a chunk runs
# eagerly, launch-bound, as long as a whole short prompt, and one part-prefilled prompt at a time
# admits newcomers slower than they arrive. Chunks pay once they run as graphs, beside the decode.
DEFAULT_PREFILL_CHUNK_TOKENS = 0
# ``--prefill-batch``'s default, the whole prompts prefilled together in one forward at most (engine.py).
# Measured on an H200 (docs/validation/serve-gpu.md, fifth run): an 8B's eager prefill costs ~27 ms
# for any prompt up to 256 tokens (its launches, not its tokens), 8 prompts of 64 tokens in one
# forward 30 ms; served at 8, the memory-capped pair's pipeline held 1,486-1,561 tokens/s at p99
# time per output token 28-30 ms (646-777 at 71-82 ms one at a time), one device 752 (530) and the
# MoE 969 (760). Past 8 a forward of 512-token prompts grows with its tokens (122 ms for 8).
DEFAULT_PREFILL_BATCH = 8
# the padded prompt tokens one such forward holds at most (a longer prompt runs alone): what
# ``memory.FIXED_WORKSPACE_BYTES`` keeps room for
PREFILL_BATCH_TOKENS = 4096


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


def checked_prefill(chunk_tokens: int, batch: int | None) -> int:
    """The whole prompts a prefill forward takes at most, given ``--prefill-chunk`` and
    ``--prefill-batch`` (None: :data:`DEFAULT_PREFILL_BATCH` for whole prompts, 1 with chunks, which
    run one prompt at a time); UsageError saying why when they do not go together."""
    if chunk_tokens < 0:
        raise UsageError(f"--prefill-chunk takes a number of tokens, 0 for whole prompts, got {chunk_tokens}")
    if batch is not None and batch < 1:
        raise UsageError(f"--prefill-batch takes the whole prompts one forward prefills at most (1 or more), got {batch}")
    if chunk_tokens and batch is not None and batch > 1:
        raise UsageError("--prefill-batch batches whole prompts and --prefill-chunk cuts them into chunks: pass one of "
                         "the two")
    return batch if batch is not None else 1 if chunk_tokens else DEFAULT_PREFILL_BATCH
