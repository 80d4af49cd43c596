"""The generation loop: continuous batching at step granularity over a backend's slots.

One thread owns the backend. Each step:

1. requests whose client went away leave their slots (one being prefilled too);
2. prompts are prefilled, oldest first: with ``prefill_chunk_tokens`` (``--prefill-chunk``) at most
   that many prompt tokens a step, in chunks (the prompt being prefilled goes on where it stopped,
   then waiting requests move into free slots, ``scheduler.py``, one at a time while the budget
   lasts; a long prompt takes several steps); with None (or 0) every newcomer's whole prompt, up to
   ``prefill_batch`` (``--prefill-batch``) of them in one forward per backend (``prefill_many``:
   the launches of one forward for several prompts, at most :data:`PREFILL_BATCH_TOKENS` padded
   tokens; a backend without it takes them one at a time; the split's prefill backend takes as
   many as it has staging slots, then hands each over). A
   request holds its slot from its first chunk but decodes only after its last, which gives its
   first token (and its time to first token);
3. one decode forward per backend runs every request in a slot there whose prompt is whole, each
   at its own position, and gives each its next token. A request whose token is a stop token, or
   that reached ``max_tokens``, leaves its slot at once, so the next step's newcomer reuses it.

Why chunks: a step's prefill delays every running request's next token, and a chunk bounds what a
step adds, at the cost of a long prompt's time to first token. Measured on an H200 they did not
pay while chunks run eagerly, so the server's default is whole prompts (``scheduler.py``,
docs/validation/serve-gpu.md). Since the budget goes oldest first, at most one prompt is part
prefilled between steps, which is what lets the split's first staging slot, and a graph backend's
row moves, keep it (``rows.py``).

Which backend prefills and which decodes a request is the :class:`~kernelfleet.serve.strategies.Strategy`'s
(one device, request distribution, prefill/decode split, layer pipeline); a plain backend is the
``single`` one. Busy time is counted per device: a backend's forwards under its ``device``, or,
for a backend with a ``busy`` attribute (the pipeline's, over several devices), by the backend
itself through that callback. A backend with a ``queued`` method (the placed backend, whose online
monitor counts it) is told how long each request it admits waited in the queue.

Tokens go to each request's ``sink`` (called on the engine's thread: the API hands them to its
event loop) as ``sink(token_id, finish_reason)``, ``finish_reason`` None until the last token;
a backend failure ends the requests of that forward with ``sink(None, "error")``. Time comes from
``clock`` (STYLE: passed in); the thread sleeps while there is nothing to do.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kernelfleet.errors import KernelfleetError
from kernelfleet.serve.backend import Backend
from kernelfleet.serve.metrics import FINISH_REASONS, ServeMetrics
from kernelfleet.serve.sampling import Sampler, Sampling
from kernelfleet.serve.scheduler import PREFILL_BATCH_TOKENS, Scheduler, checked_prefill
from kernelfleet.serve.strategies import STAGE_SLOT, Strategy, single

log = logging.getLogger(__name__)

Sink = Callable[[int | None, str | None], None]
Watch = Callable[[int, bool], bool]  # (token, last) -> the request is done: a stop the token ids cannot see
STOP, LENGTH, CANCELLED, ERROR = FINISH_REASONS


class Closed(KernelfleetError):
    """The loop takes no more requests."""


@dataclass(eq=False)
class Request:
    """One completion in the loop: its prompt, limits and what it generated so far."""

    prompt: list[int]
    max_tokens: int
    stop_token_ids: frozenset[int]
    sampler: Sampler
    sink: Sink
    arrival_seconds: float
    generated: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the cache so far
    last_token_seconds: float | None = None
    cancelled: bool = False
    watch: Watch | None = None  # called with each token before its sink (stops.py: OpenAI's stop strings)

    @property
    def position(self) -> int:
        """Where the token fed next (the last one generated) goes in the cache."""
        return len(self.prompt) + len(self.generated) - 1


class Engine:
    """The loop over ``backend`` with a queue of ``max_queue``, prefilling at most
    ``prefill_chunk_tokens`` prompt tokens a step (None or 0: whole prompts, ``prefill_batch`` of them
    a forward at most, None: the server's default; module docstring)."""

    def __init__(self, backend: Backend | Strategy, max_queue: int, metrics: ServeMetrics | None = None,
                 clock: Callable[[], float] = time.perf_counter, prefill_chunk_tokens: int | None = None,
                 prefill_batch: int | None = None) -> None:
        self.prefill_batch = checked_prefill(prefill_chunk_tokens or 0, prefill_batch)
        self.prefill_chunk_tokens = prefill_chunk_tokens or None
        self.partial: tuple[int, Request] | None = None  # the request part prefilled, in its slot
        self.strategy = backend if isinstance(backend, Strategy) else single(backend)
        self.clock = clock
        self.metrics = metrics or ServeMetrics(max_queue)
        self.scheduler: Scheduler[Request] = Scheduler(self.strategy.slots, max_queue, self.strategy.choose)
        for each in [*self.strategy.backends, *filter(None, [self.strategy.prefill_on])]:
            if hasattr(each, "busy"):  # a backend over several devices (the pipeline) counts each one's time itself
                each.busy = self._busy
            # every device's busy counter exported at 0 from the start, so a rate() sees its first forwards
            for device in [stage.name for stage in getattr(each, "stages", [])] or [each.device]:
                self.metrics.busy.labels(device)
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def backend(self) -> Backend:
        """The first decode backend: the only one under ``single``."""
        return self.strategy.backends[0]

    @property
    def context_tokens(self) -> int:
        return self.strategy.context_tokens

    @property
    def slots(self) -> int:
        return self.strategy.slots

    def submit(self, prompt: list[int], max_tokens: int, stop_token_ids: frozenset[int], sampling: Sampling,
               sink: Sink, watch: Watch | None = None) -> Request:
        """Queue a request (QueueFull when the queue holds ``max_queue``, Closed once the loop has
        stopped); its tokens go to ``sink``, each after ``watch`` (if any) said whether it ends the request."""
        request = Request(prompt, max_tokens, stop_token_ids, Sampler(sampling), sink, self.clock(), watch=watch)
        with self._wake:
            if self._closing:
                raise Closed("the generation loop has stopped (the server's log says why)")
            self.scheduler.submit(request)
            self._gauges()
            self._wake.notify()
        return request

    def cancel(self, request: Request) -> None:
        """The client went away: the request leaves the queue now, or its slot at the next step."""
        with self._wake:
            request.cancelled = True
            if self.scheduler.withdraw(request):
                self.metrics.finished.labels(CANCELLED).inc()
                self._gauges()

    def step(self) -> bool:
        """One step of the loop (module docstring); False when there was nothing to run."""
        with self._wake:
            for slot, request in list(self.scheduler.running.items()):
                if request.cancelled:
                    self._leave(slot, CANCELLED)
        prefilled = self._prefills()
        partial = None if self.partial is None else self.partial[0]
        running = sorted((slot, r) for slot, r in self.scheduler.running.items() if slot != partial)
        if not running:
            return prefilled
        groups: list[list[tuple[int, Request]]] = [[] for _ in self.strategy.backends]
        for slot, request in running:
            groups[self.strategy.locate(slot)[0]].append((slot, request))
        # every backend's decode is launched before any result is read: GPUs run side by side
        launched = []
        for backend, batch in zip(self.strategy.backends, groups):
            if batch:
                slots = [slot for slot, _ in batch]
                logits = self._run(slots, backend, backend.decode, [self.strategy.locate(s)[1] for s in slots],
                                   [r.generated[-1] for _, r in batch], [r.position for _, r in batch])
                if logits is not None:
                    launched.append((backend, batch, logits))
        for backend, batch, logits in launched:
            started = self.clock()
            greedy = logits.argmax(-1).tolist()  # one host read for the batch, not one per row
            self.metrics.busy.labels(backend.device).inc(self.clock() - started)  # the wait for its results
            for row, (slot, request) in enumerate(batch):
                self._next(slot, request, logits[row], greedy[row])
        return True

    def _prefills(self) -> bool:
        """This step's prefill (module docstring, 2.): the part-prefilled request's next chunk, then
        newcomers while the budget lasts; each whole prompt's first token. False when none ran."""
        if self.prefill_batch > 1 and self.prefill_chunk_tokens is None:
            return self._batched()
        budget = self.prefill_chunk_tokens
        ran = False
        while budget is None or budget > 0:
            if self.partial is None:
                with self._wake:
                    admitted = self.scheduler.admit(most=1)
                    self._gauges()
                if not admitted:
                    return ran
                self._queued(admitted)
                self.partial = admitted[0]
            slot, request = self.partial
            count = len(request.prompt) - request.prefilled
            count = count if budget is None else min(count, budget)
            budget = None if budget is None else budget - count
            ran = True
            logits = self._chunk(slot, request, count)
            if logits is None:  # failed: the request has left its slot
                self.partial = None
            elif request.prefilled == len(request.prompt):
                self.partial = None
                self._next(slot, request, logits)
        return ran

    def _batched(self) -> bool:
        """Whole prompts, as many newcomers as :meth:`_batch_size` allows, one forward per backend
        (``prefill_many``; one at a time where a backend has none), or under ``split`` one forward
        on the prefill backend, each prompt in a staging slot of its own, then each handed over;
        each one's first token."""
        with self._wake:
            admitted = self.scheduler.admit(most=self._batch_size())
            self._gauges()
        self._queued(admitted)
        prefiller = self.strategy.prefill_on
        groups: dict[int | None, list[tuple[int, Request]]] = {}
        for slot, request in admitted:
            groups.setdefault(None if prefiller else self.strategy.locate(slot)[0], []).append((slot, request))
        for index, batch in groups.items():
            backend = prefiller or self.strategy.backends[index]
            if len(batch) == 1 or not hasattr(backend, "prefill_many"):
                for slot, request in batch:
                    if (logits := self._chunk(slot, request, len(request.prompt))) is not None:
                        self._next(slot, request, logits)
                continue
            slots = [slot for slot, _ in batch]
            into = list(range(len(batch))) if prefiller else [self.strategy.locate(s)[1] for s in slots]
            logits = self._run(slots, backend, backend.prefill_many, into, [request.prompt for _, request in batch])
            if logits is None:
                continue
            for row, (slot, request) in enumerate(batch):
                if self._took(slot, request, len(request.prompt), row):  # staging slot ``row`` under split
                    self._next(slot, request, logits[row])
        return bool(admitted)

    def _queued(self, admitted: list[tuple[int, Request]]) -> None:
        """Each admitted request's wait in the queue, told to its backend where the backend takes it
        (``queued``: the placed backend's online monitor counts it in the request's latency)."""
        now = self.clock()
        for slot, request in admitted:
            index, local = self.strategy.locate(slot)
            if hasattr(backend := self.strategy.backends[index], "queued"):
                backend.queued(local, now - request.arrival_seconds)

    def _batch_size(self) -> int:
        """How many waiting requests the next batched prefill takes: at most ``prefill_batch``, oldest
        first, while their prompts padded to the longest stay within :data:`PREFILL_BATCH_TOKENS`
        (the first always), and under ``split`` at most the prefill backend's staging slots."""
        count = longest = 0  # the caller holds the lock
        most = self.prefill_batch if self.strategy.prefill_on is None else min(self.prefill_batch,
                                                                              self.strategy.prefill_on.slots)
        for request in itertools.islice(self.scheduler.waiting, most):
            longest = max(longest, len(request.prompt))
            if count and (count + 1) * longest > PREFILL_BATCH_TOKENS:
                break
            count += 1
        return max(count, 1)

    def _chunk(self, slot: int, request: Request, count: int) -> torch.Tensor | None:
        """The next ``count`` prompt tokens of ``request`` into ``slot``'s cache, and the logits of
        the last: prefilled on the slot's own backend, or (``split``) on the prefill backend, handed
        over after the prompt's last chunk. None when a forward failed (the request ended)."""
        index, local = self.strategy.locate(slot)
        decoder, prefiller = self.strategy.backends[index], self.strategy.prefill_on
        start = request.prefilled
        chunk = request.prompt[start:start + count]
        on, into = (decoder, local) if prefiller is None else (prefiller, STAGE_SLOT)
        logits = self._run([slot], on, on.prefill, into, chunk, start)
        if logits is None or not self._took(slot, request, count, STAGE_SLOT):
            return None
        return logits

    def _took(self, slot: int, request: Request, count: int, staged: int) -> bool:
        """``count`` more of ``request``'s prompt tokens are in the cache: counted, and under ``split``,
        once the prompt is whole, handed over from the prefill backend's slot ``staged`` to ``slot``'s
        on its decode backend. False when the hand-over failed (the request ended)."""
        request.prefilled += count
        self.metrics.prompt.inc(count)
        prefiller = self.strategy.prefill_on
        if prefiller is None or request.prefilled < len(request.prompt):
            return True
        index, local = self.strategy.locate(slot)
        decoder = self.strategy.backends[index]
        return self._run([slot], decoder, decoder.adopt, local, *prefiller.kv(staged), request.prefilled) is not None

    def _run(self, slots: list[int], backend: Backend, forward: Callable[..., object], *args: object) -> object:
        """``forward(*args)`` on ``backend``, its time counted as the device's busy time; None
        (and its requests ended with an error) when it fails."""
        started = self.clock()
        try:
            done = forward(*args)
            return True if done is None else done
        except Exception:  # a failed forward ends its requests; the loop and the other slots go on
            log.exception("a forward over slots %s failed; its requests end with an error", slots)
            self._fail(slots)
            return None
        finally:
            if not hasattr(backend, "busy"):
                self._busy(backend.device, self.clock() - started)

    def _busy(self, device: str, seconds: float) -> None:
        self.metrics.busy.labels(device).inc(seconds)

    def _next(self, slot: int, request: Request, logits: torch.Tensor, greedy: int | None = None) -> None:
        try:
            token = request.sampler.choose(logits, greedy)
        except RuntimeError:  # logits with a NaN or an infinity cannot be sampled from
            log.exception("the logits of the request in slot %s cannot be sampled; it ends with an error", slot)
            self._fail([slot])
            return
        now = self.clock()
        if request.last_token_seconds is None:
            self.metrics.first_token.observe(now - request.arrival_seconds)
        else:
            self.metrics.per_token.observe(now - request.last_token_seconds)
        request.last_token_seconds = now
        request.generated.append(token)
        self.metrics.generated.inc()
        reason = STOP if token in request.stop_token_ids else LENGTH if len(request.generated) >= request.max_tokens \
            else None
        if request.watch is not None and request.watch(token, reason is not None):
            reason = STOP
        if reason is not None:  # counted before its client has the last token: /metrics then shows it
            with self._wake:
                self._leave(slot, reason)
                self._gauges()
        if not request.cancelled:
            request.sink(token, reason)

    def _fail(self, slots: list[int]) -> None:
        with self._wake:
            for slot in slots:
                request = self.scheduler.running[slot]
                self._leave(slot, ERROR)
                if not request.cancelled:
                    request.sink(None, ERROR)
            self._gauges()

    def _leave(self, slot: int, reason: str) -> None:
        if self.partial is not None and self.partial[0] == slot:
            self.partial = None  # cancelled or failed mid-prefill: its slot and row go to the next request
        self.scheduler.release(slot)
        self.metrics.finished.labels(reason).inc()

    def _gauges(self) -> None:
        self.metrics.waiting.set(len(self.scheduler.waiting))
        self.metrics.running.set(len(self.scheduler.running))

    def run(self) -> None:
        """Step until :meth:`close`, sleeping while no request waits or runs."""
        while True:
            with self._wake:
                while not self._closing and not self.scheduler.waiting and not self.scheduler.running:
                    self._wake.wait()
                if self._closing:
                    return
            try:
                self.step()
            except Exception:  # a bug in the loop itself: no client may wait for a token that never comes
                log.exception("the generation loop failed; every request ends with an error")
                with self._wake:
                    self._closing = True
                    self._fail(list(self.scheduler.running))
                    for request in self.scheduler.drain():
                        request.sink(None, ERROR)
                return  # alive() turns False: /healthz answers 503 and `kernelfleet serve` exits

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self.run, name="kernelfleet-serve-engine", daemon=True)
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout_seconds: float = 10.0) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=timeout_seconds)
