"""The graph backend: decode as one captured CUDA graph per (batch bucket, context bucket), prefill eagerly.

At start, for each batch bucket (1, 2, 4, ... and the slots themselves: :func:`buckets`) and each
context bucket (128, 256, ... tokens and the context itself: :func:`lengths`) it captures the
graph-safe forward of :class:`~kernelfleet.serve.backend.EagerBackend` (``rows=None``: the batch is
the cache's first rows, each attending the bucket's first positions, masked per row) over the
bucket's persistent inputs, one ``(2, bucket)`` tensor holding the token ids and positions.

``decode`` first keeps the running requests in the first cache rows (``rows.py``: a request that
left frees its row, and one past the running count moves into it), lays the batch out in row
order, pads it to the smallest batch bucket that holds it, takes the shortest context bucket that
holds its furthest position, copies the two rows of inputs in with one host-to-device copy, replays
that graph, and returns the logits in the engine's order. Context buckets exist because a masked
attention costs what it reads, not what it keeps: on an H200 an 8B's batch-1 step took 8.04 ms
attending 2048 positions and 6.81 ms attending 48 (docs/validation/serve-gpu.md, second run). Pad rows
write token 0 at the context's last position of rows past the running ones: no running request
holds those rows, and no request ever writes that position (the API keeps a prompt and its
``max_tokens`` within the context, and a request's last token is never fed back, so the last
position fed is the context's last but one). So a pad row never touches a request's keys and
values, not even those of a request being prefilled in chunks that holds a row past the running
ones (``rows.py``); under a shorter context bucket it writes past what the bucket attends, and attends
the bucket's positions of its own row, whose output nobody reads.

Prefill stays eager (a prompt, its chunk, or several whole prompts at once: ``prefill_many``):
prompts and their chunks have any length. It writes the same
:class:`~kernelfleet.serve.cache.SlotCache` tensors the graphs read; the slot a chunk went into is
held (``Rows.prefilled``) until it decodes, so the row moves keep its keys and values.

The graphs share one memory pool and are captured largest first (batch, then context), so the
smaller ones reuse the largest one's activations; a batch bucket's context buckets write one shared
logits tensor (``captured``'s ``into``), so more context buckets keep no more memory. The logits a
replay returns live in that pool: they are valid until the next ``decode`` (the engine samples from
them at once).

``graphs=False`` is the CPU twin: the same buckets, padding, persistent inputs and forward, each
"replay" the captured call run eagerly, so CI runs every line of this control flow but the capture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernelfleet.errors import EnvironmentProblem
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.cache import SlotCache
from kernelfleet.serve.rows import Rows


def buckets(slots: int) -> list[int]:
    """Batch sizes captured for ``slots`` slots: the powers of two below it, and ``slots``."""
    sizes, size = [], 1
    while size < slots:
        sizes.append(size)
        size *= 2
    return [*sizes, slots]


SHORTEST_CONTEXT = 128  # the shortest context bucket: a choice (each bucket is a capture per batch bucket)


def lengths(context_tokens: int, shortest: int = SHORTEST_CONTEXT) -> list[int]:
    """Context buckets for ``context_tokens`` tokens a slot: ``shortest`` and its doublings below
    the context, and the context itself."""
    sizes, size = [], shortest
    while size < context_tokens:
        sizes.append(size)
        size *= 2
    return [*sizes, context_tokens]


def bucket_for(batch: int, sizes: list[int]) -> int:
    """The smallest of ``sizes`` (ascending) that holds ``batch`` rows (or positions)."""
    for size in sizes:
        if size >= batch:
            return size
    raise ValueError(f"a batch of {batch} rows is more than the largest bucket, {sizes[-1]}")


def padded(token_ids: list[int], positions: list[int], size: int, pad_position: int) -> list[list[int]]:
    """The two input rows of a ``size`` bucket, ids and positions; pad rows feed token 0 at
    ``pad_position`` (the context's last: module docstring)."""
    pad = size - len(token_ids)
    return [token_ids + [0] * pad, positions + [pad_position] * pad]


class CaptureFailed(EnvironmentProblem):
    """A bucket's decode graph could not be captured (the message says which and why)."""


@dataclass(eq=False)
class Bucket:
    """One (batch size, context length)'s captured decode: its persistent inputs, graph and output."""

    size: int
    inputs: torch.Tensor  # (2, size): token ids, positions; batch row i is cache row i
    length: int | None = None  # the positions attended (None: the whole context, as placed steps attend)
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None

    def forward(self, backend: EagerBackend) -> torch.Tensor:
        ids, positions = self.inputs
        return backend.forward(ids[:, None], None, positions[:, None], self.length)


def captures(sizes: list[int], context_lengths: list[int]) -> list[tuple[int, int]]:
    """The (batch, context) buckets in capture order: largest first, so the rest reuse its memory."""
    return [(size, length) for size in reversed(sizes) for length in reversed(context_lengths)]


def described(size: int, length: int) -> str:
    return f"batch bucket {size}, context {length}"


class GraphBackend:
    """The model of ``eager`` decoding through captured graphs on its CUDA device (module docstring);
    the engine's slot ``s`` lives in cache row ``rows.row_of[s]`` of ``eager``'s cache.
    ``device_name`` names the device in the metrics (default: torch's name of it); ``progress(done,
    what)`` after each capture; ``shortest``: the shortest context bucket (:func:`lengths`)."""

    def __init__(self, eager: EagerBackend, progress: Callable[[int, str], None] | None = None,
                 graphs: bool = True, device_name: str | None = None, shortest: int = SHORTEST_CONTEXT) -> None:
        self.eager_backend, self.graphs = eager, graphs
        self.slots, self.context_tokens = eager.slots, eager.context_tokens
        self.device = device_name or eager.device  # its name in the metrics; torch's is eager.torch_device
        self.rows = Rows(eager.slots)
        self.sizes, self.lengths = buckets(eager.slots), lengths(eager.context_tokens, shortest)
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        # the cache is allocated outside any graph, by a prefill into row 0 (the first request's prefill overwrites it)
        eager.prefill(0, [0])
        for done, (size, length) in enumerate(captures(self.sizes, self.lengths), 1):
            self.buckets[size, length] = self._captured(size, length)
            (progress or (lambda done, what: None))(done, described(size, length))

    @torch.inference_mode()
    def _captured(self, size: int, length: int) -> Bucket:
        bucket = Bucket(size, torch.tensor(padded([], [], size, self.context_tokens - 1),
                                           device=self.eager_backend.torch_device), length)
        if self.graphs:
            whole = self.buckets.get((size, self.lengths[-1]))  # captured first (captures): its logits are shared
            bucket.graph, bucket.logits = captured(lambda: bucket.forward(self.eager_backend), self.pool,
                                                   self.eager_backend.torch_device,
                                                   f"the decode graph of {described(size, length)}",
                                                   None if whole is None else whole.logits)
        return bucket

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        return self.eager_backend.prefill(self.rows.prefilled(slot, start + len(token_ids)), token_ids, start)

    def prefill_many(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        rows = [self.rows.prefilled(slot, len(prompt)) for slot, prompt in zip(slots, prompts)]
        return self.eager_backend.prefill_many(rows, prompts)

    def kv(self, slot: int) -> tuple[SlotCache, int]:
        return self.eager_backend.cache, self.rows.row_of[slot]

    def adopt(self, slot: int, source: SlotCache, row: int, tokens: int) -> None:
        # into the row the slot takes, as a prefill there would write it; the cache was allocated at
        # start, so the copy writes the tensors the graphs read
        self.eager_backend.adopt(self.rows.take(slot), source, row, tokens)

    @torch.inference_mode()
    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor:
        row, size, inputs = laid_out(self.rows, [self.eager_backend.cache], slots, token_ids, positions, self.sizes)
        bucket = self.buckets[size, bucket_for(max(positions) + 1, self.lengths)]
        bucket.inputs.copy_(inputs)  # one small copy; the previous replay is done by now (the engine read its logits)
        if bucket.graph is None:  # the CPU twin
            bucket.logits = bucket.forward(self.eager_backend)
        else:
            bucket.graph.replay()
        return in_engine_order(bucket.logits, row)


def laid_out(rows: Rows, caches: list[SlotCache], slots: list[int], token_ids: list[int], positions: list[int],
             sizes: list[int]) -> tuple[list[int], int, torch.Tensor]:
    """A decode's batch laid out for a bucket's graph: the running ``slots`` moved into the first
    rows of every one of ``caches`` (rows.py; a slot being prefilled, ``Rows.held``, keeps its own),
    then the cache row of each engine row, the bucket that holds them, and its two input rows (ids,
    positions) in row order, padded, on the host."""
    at = dict(zip(slots, positions))  # what each wrote so far: the positions below its next
    keep, kept = rows.held(slots) or (None, 0)
    for slot, source, target in rows.compact(slots, keep):
        tokens = max(at[slot], kept if rows.row_of.get(keep) == source else 0)
        for cache in caches:
            cache.exchange(source, target, tokens)
    row = [rows.row_of[slot] for slot in slots]  # the cache row, so the batch row, of each engine row
    order = sorted(range(len(slots)), key=row.__getitem__)
    size = bucket_for(len(slots), sizes)
    pad = caches[0].context_tokens - 1
    return row, size, torch.tensor(padded([token_ids[i] for i in order], [positions[i] for i in order], size, pad))


def in_engine_order(logits: torch.Tensor, row: list[int]) -> torch.Tensor:
    """A bucket's logits (one per cache row) as the engine's rows, whose cache rows are ``row``."""
    if row == sorted(row):
        return logits[:len(row)]
    return logits[torch.tensor(row, device=logits.device)]


def captured(forward: Callable[[], torch.Tensor], pool: object, torch_device: str, what: str,
             into: torch.Tensor | None = None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``forward`` captured as a CUDA graph on ``torch_device`` in memory ``pool``, and its output;
    CaptureFailed saying ``what`` failed and why. With ``into`` (another graph's output, kept alive),
    the graph copies its output there: the graphs of one batch bucket's context buckets share one
    output, so the pool keeps one a batch bucket, not one a graph."""
    try:
        # the capture's own stream is made on the current device: make it this one
        with torch.cuda.device(torch_device):
            # warm-up on a side stream, as torch.cuda.graphs asks: lazy initialisation (cuBLAS
            # handles, kernel choices) happens before the capture, not inside it
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                output = forward() if into is None else into.copy_(forward())
    except torch.OutOfMemoryError as exc:
        raise CaptureFailed(f"capturing {what} failed: out of memory ({first_line(exc)}); use fewer --slots or a "
                            "shorter --context") from exc
    except RuntimeError as exc:
        raise CaptureFailed(f"capturing {what} failed: {why(exc)}") from exc
    return graph, output


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def why(exc: RuntimeError) -> str:
    """A capture's failure in words: what torch says, and what it means for a model's forward."""
    said = first_line(exc)
    if "capturing" in said or "capture" in said:  # torch: "operation not permitted when stream is capturing"
        return (f"an op synchronises with the host inside the forward (.item(), a data-dependent shape or a "
                f"host copy): {said}")
    return said
