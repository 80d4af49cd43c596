"""The layer pipeline: a model's decoder layers cut into stages, one a device, hidden states
passed from each to the next.

Each :class:`Stage` runs one device's part (``parts.py``: its layers, the embedding on the first,
the norm and head on the last). A :class:`PipelineBackend` is one micro-batch group of slots: each
stage holds the keys and values of its own layers for every slot of the group (one
:class:`~kernelfleet.serve.cache.SlotCache` a stage), and a prefill (a prompt or its chunk at an
offset, or several whole prompts at once) or a decode runs through the stages in order, the hidden states copied device to device between them (between GPUs a copy
queued without a host wait; torch orders it after the stage before and before the next).

Micro-batches: the strategy splits the slots into groups (``--micro-batches``, default 2), each
its own backend, and the engine launches every backend's decode before it reads any result
(``engine.py``). So on GPUs, stage 1 runs group A while stage 0 already runs group B: the stages
work side by side instead of each waiting for the other. On the CPU nothing overlaps; what it
costs there is in docs/serve.md.

``graphs=True`` is the graph path: a decode graph per (stage, batch bucket, context bucket: as
``graphs.py``'s), captured on a stage's GPU
(the CPU twin runs the same buckets, padding, persistent inputs and row moves eagerly, as
``graphs.py``'s does). Stage 0's persistent input is the bucket's token ids and positions, copied
in from the host; every later stage's are the positions and hidden states of the stage before,
copied device to device. Each (group, stage) has its own memory pool: a group's logits must live
until the engine reads them, after the other group's graphs ran. ``graphs=False`` runs each step
eagerly over just the running rows (what ``--cpu`` serves).

Busy time is counted per stage device (``busy``, set by the engine): the time the loop spent in
that stage's forward; the wait for the logits counts on the last stage, the backend's ``device``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernelfleet.serve.backend import call_arguments, right_aligned
from kernelfleet.serve.cache import SlotCache, attention_mask
from kernelfleet.serve.graphs import (
    SHORTEST_CONTEXT,
    bucket_for,
    buckets,
    captured,
    captures,
    described,
    in_engine_order,
    laid_out,
    lengths,
    padded,
)
from kernelfleet.serve.parts import Part
from kernelfleet.serve.rows import Rows


class Stage:
    """One device's part of the model (``parts.Part``), named ``name`` in the metrics (default:
    torch's name of its device)."""

    def __init__(self, part: Part, name: str | None = None) -> None:
        self.part = part
        parameter = next(part.module.parameters())
        self.torch_device, self.dtype = str(parameter.device), parameter.dtype
        self.name = name or self.torch_device
        self.hidden_size = part.base.config.hidden_size
        self.eager = part.module.config._attn_implementation == "eager"
        self.cache_argument, self.keep_argument = call_arguments(part.module)

    @torch.inference_mode()
    def forward(self, inputs: torch.Tensor, cache: SlotCache, rows: torch.Tensor | None, positions: torch.Tensor,
                length: int | None) -> torch.Tensor:
        """The stage's layers over ``inputs`` (token ids on the first stage, else the hidden states of
        the one before) into ``cache``'s ``rows`` at ``positions`` (cache.py's two ways to aim);
        the next stage's hidden states, or on the last the logits of each row's last token."""
        cache.aim(rows, positions, length)
        mask = attention_mask(positions, cache.length, self.eager, self.dtype)
        given = {"input_ids": inputs} if self.part.first else {"inputs_embeds": inputs}
        common = {"position_ids": positions, "attention_mask": mask, "use_cache": True, self.cache_argument: cache}
        if self.part.last:
            return self.part.module(**given, **common, **{self.keep_argument: 1}).logits[:, -1].float()
        return self.part.base(**given, **common).last_hidden_state


@dataclass(eq=False)
class StageBucket:
    """One stage's captured decode of one (batch size, context length): its persistent inputs, graph
    and output."""

    stage: Stage
    cache: SlotCache
    inputs: torch.Tensor  # (2, size): token ids (read by the first stage only), positions
    hidden: torch.Tensor | None  # (size, 1, hidden): the stage before's output (None on the first)
    length: int  # the positions attended
    graph: torch.cuda.CUDAGraph | None = None
    output: torch.Tensor | None = None

    def forward(self) -> torch.Tensor:
        ids, positions = self.inputs
        return self.stage.forward(ids[:, None] if self.hidden is None else self.hidden, self.cache, None,
                                  positions[:, None], self.length)


class PipelineBackend:
    """One micro-batch group of ``slots`` slots run through ``stages`` (module docstring);
    ``progress(done, what)`` after each bucket's captures; ``shortest``: the shortest context bucket."""

    def __init__(self, stages: list[Stage], slots: int, context_tokens: int, graphs: bool = False,
                 progress: Callable[[int, str], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter, shortest: int = SHORTEST_CONTEXT) -> None:
        self.stages, self.slots, self.context_tokens, self.graphs = stages, slots, context_tokens, graphs
        self.caches = [SlotCache(slots, context_tokens, stage.torch_device) for stage in stages]
        self.device = stages[-1].name  # where the logits are read
        self.busy: Callable[[str, float], None] | None = None  # the engine's per-device busy counter
        self.clock = clock
        self.rows = Rows(slots)
        self.sizes, self.lengths = buckets(slots), lengths(context_tokens, shortest)
        self.buckets: dict[tuple[int, int], list[StageBucket]] = {}
        if not graphs:
            return
        pools = [torch.cuda.graph_pool_handle() if s.torch_device.startswith("cuda") else None for s in stages]
        # the caches are allocated outside any graph, by a prefill into row 0 (a request's prefill overwrites it)
        self._through(torch.tensor([[0]]), 0, torch.arange(1)[None, :], 1)
        for done, (size, length) in enumerate(captures(self.sizes, self.lengths), 1):
            self.buckets[size, length] = [self._captured(i, size, length, pool) for i, pool in enumerate(pools)]
            (progress or (lambda done, what: None))(done, described(size, length))

    @torch.inference_mode()
    def _captured(self, index: int, size: int, length: int, pool: object) -> StageBucket:
        stage = self.stages[index]
        hidden = None if index == 0 else torch.zeros(size, 1, stage.hidden_size, dtype=stage.dtype,
                                                     device=stage.torch_device)
        inputs = torch.tensor(padded([], [], size, self.context_tokens - 1), device=stage.torch_device)
        bucket = StageBucket(stage, self.caches[index], inputs, hidden, length)
        if pool is not None:
            whole = self.buckets.get((size, self.lengths[-1]))  # captured first: its outputs are shared (graphs.py)
            bucket.graph, bucket.output = captured(bucket.forward, pool, stage.torch_device,
                                                   f"stage {index + 1}'s decode graph of {described(size, length)}",
                                                   None if whole is None else whole[index].output)
        return bucket

    def _timed(self, stage: Stage, started: float) -> None:
        if self.busy is not None:
            self.busy(stage.name, self.clock() - started)

    def _through(self, ids: torch.Tensor, row: int | torch.Tensor, positions: torch.Tensor,
                 length: int) -> torch.Tensor:
        """An eager forward of ``ids`` (batch, tokens) at ``positions`` into ``row`` (the cache rows)
        through every stage; the last stage's logits."""
        out = ids
        for stage, cache in zip(self.stages, self.caches):
            started = self.clock()
            rows = torch.as_tensor(row, device=stage.torch_device).reshape(-1)
            out = stage.forward(out.to(stage.torch_device, non_blocking=True), cache, rows,
                                positions.to(stage.torch_device), length)
            self._timed(stage, started)
        return out

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        """A prompt or its chunk at ``start`` through the stages (backend.py's ``prefill``)."""
        positions = torch.arange(start, start + len(token_ids))[None, :]
        row = self.rows.prefilled(slot, start + len(token_ids)) if self.graphs else slot  # eagerly a slot is its row
        return self._through(torch.tensor([token_ids]), row, positions, start + len(token_ids))[0]

    def prefill_many(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Whole prompts through the stages in one forward (backend.py's ``prefill_many``)."""
        rows = [self.rows.prefilled(slot, len(p)) if self.graphs else slot for slot, p in zip(slots, prompts)]
        ids, positions, longest = right_aligned(prompts, self.context_tokens - 1)
        return self._through(torch.tensor(ids), torch.tensor(rows), torch.tensor(positions), longest)

    @torch.inference_mode()
    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor:
        if not self.graphs:
            return self._through(torch.tensor(token_ids)[:, None], torch.tensor(slots),
                                 torch.tensor(positions)[:, None], max(positions) + 1)
        row, size, inputs = laid_out(self.rows, self.caches, slots, token_ids, positions, self.sizes)
        before: StageBucket | None = None
        for bucket in self.buckets[size, bucket_for(max(positions) + 1, self.lengths)]:
            started = self.clock()
            if before is None:
                bucket.inputs.copy_(inputs)  # the previous replay is done by now (the engine read its logits)
            else:  # device to device, queued after the stage before's replay
                bucket.inputs.copy_(before.inputs, non_blocking=True)
                bucket.hidden.copy_(before.output, non_blocking=True)
            if bucket.graph is None:  # the CPU twin
                bucket.output = bucket.forward()
            else:
                bucket.graph.replay()
            self._timed(bucket.stage, started)
            before = bucket
        return in_engine_order(before.output, row)
