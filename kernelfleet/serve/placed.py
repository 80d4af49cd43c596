"""The placed backend: decode through kernelfleet's plans, a graph per batch bucket, context bucket and policy.

Every device holds a model (its share of the weights, ``placed_build.py``) and a
:class:`~kernelfleet.serve.cache.SlotCache` of the server's slots (its own
:class:`~kernelfleet.serve.backend.EagerBackend`); per batch bucket each
device captured the server's decode step (``placed_step.py``) and the executor built, from those
captures, one graph per policy: the bucket's latency plan and its throughput plan
(``placed_plans.py``, ``runtime/executor.build`` with ``resident_state``). Plans are made for the
whole context; where the server was asked for shorter context buckets (``--shortest-context``),
each device also captured the step attending fewer positions and each plan was carried to that
capture (``placed_build.py``): one graph per (batch bucket, context bucket, policy), as the graph
backend has one per (batch bucket, context bucket). They replace its single-device decode graphs:

* ``decode`` asks the online monitor (``runtime/monitor.Monitor``) once, before anything runs, which
  policy this step runs under, lays the batch out as the graph backend does (``graphs.laid_out``:
  running requests in the first cache rows of every device's cache, padded to the bucket), writes
  the two input rows into the home device's capture's input tensor in place, launches the graph of
  the shortest context bucket that holds the batch's furthest position, waits for it and returns
  the logits its home output holds. A switch therefore falls between two
  steps, never inside one, and every request of a step runs under one plan.
* ``prefill`` runs eagerly on the home device into its cache (where home holds only its share, on the
  devices' shares joined into one model: ``parts.joined``), then copies each layer whose cache the
  plans keep on another device (``Placement.away``) there: the request's rows, per layer,
  so each layer's decode finds them where its launches read them. (Prefilling through the plans'
  layer placement would need a prefill graph per prompt length; copying a prompt's rows is one copy
  per layer and device.)

The monitor gets one record per running request per step: latency = the time since that request's
previous token (its prefill or last decode), and in its first step also the time it waited in the
engine's queue before its slot (``queued``); execution = the step's own time. Summed over a
request's steps these are Tessera's latency (arrival to completion, less the prefill) and execution
time, so the ratio rises when requests queue for slots, or when the loop spends its time elsewhere
than the request's step (other requests' prefills, a batch grown past its bucket): Tessera's signs
of load. (Without the queue's wait it saw only the prefills between steps: 32 clients on 2 slots
switched the plan on an H200 but not on an H100, 2026-12-06.) ``/metrics`` gets the monitor's switches
(``kernelfleet_serve_plan_switches_total``) and the steps run under each policy
(``kernelfleet_serve_plan_steps_total{policy}``).

``launch(graph)`` runs a graph and returns when its outputs are ready (``placed_build.py`` gives the
executor's run on the home stream and a wait); the CPU twin (``graph.twin``) then computes the
logits with the eager bucket forward of the backend prefill runs on, so CI runs this control flow over graphs the
null driver built (tests/replay/test_serve_placed_twin.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kernelfleet.runtime.monitor import LATENCY, THROUGHPUT, Finished, Monitor
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.cache import SlotCache
from kernelfleet.serve.graphs import Bucket, bucket_for, in_engine_order, laid_out
from kernelfleet.serve.placed_plans import Placement
from kernelfleet.serve.rows import Rows


@dataclass(eq=False)
class PlanGraph:
    """One (bucket, context bucket, policy) plan's built graph (``executor.Built``), the home
    capture's input tensor it reads and the logits it writes; ``twin``: compute the logits eagerly
    (the CPU twin), attending ``length`` positions (None: the whole context); ``gate``: which gate it
    passed at start (``runtime/gate``: identical, or within tolerance and how; None: not gated, as
    the CPU twin's)."""

    built: Any
    inputs: torch.Tensor
    logits: torch.Tensor | None
    twin: bool = False
    gate: str | None = None
    length: int | None = None


def copy_rows(source: SlotCache, target: SlotCache, caches: list[tuple[int, str]], row: int, positions: range) -> None:
    """Row ``row``'s ``positions`` of ``caches`` ((layer, ``keys`` or ``values``)) from ``source``
    into ``target`` (between GPUs one device-to-device copy a tensor, queued without a host wait,
    as ``SlotCache.adopt``)."""
    where = (row, slice(None), slice(positions.start, positions.stop))
    for layer, kind in caches:
        getattr(target, kind)[layer][where].copy_(getattr(source, kind)[layer][where], non_blocking=True)


class PlacedBackend:
    """The backend of the module docstring; it prefills and decodes itself (like the pipeline's, no
    prefill/decode split runs over it). ``devices``: each device's eager backend by its name in the
    plans; ``placement``: the plans' home and KV placement; ``graphs[bucket, context bucket][policy]``
    (the context bucket: the positions its graphs attend, the whole context for the plans as made);
    ``launch`` runs a graph to completion; ``registry``: where the plan metrics go (the server's own);
    ``weights_held``: the bytes of weights each device holds (for the server's start line);
    ``whole``: the backend prefill runs on, over the home device's cache: home's own where it holds
    the whole model (the default), else the devices' shares joined (``parts.joined``); ``slower``:
    the buckets whose throughput plan's step is predicted slower than their latency plan's
    (``placed_plans.slower_under_load``, for the server's start line); ``skipped``: the context buckets
    the plans could not be carried to, one line each (``placed_build.shorter_buckets``, for the same)."""

    def __init__(self, devices: dict[str, EagerBackend], placement: Placement,
                 graphs: dict[tuple[int, int], dict[str, PlanGraph]],
                 monitor: Monitor, launch: Callable[[Any], None], registry: Any = None,
                 clock: Callable[[], float] = time.perf_counter, weights_held: dict[str, int] | None = None,
                 whole: EagerBackend | None = None, slower: list[tuple[int, float, float]] | None = None,
                 skipped: list[str] | None = None) -> None:
        self.devices, self.placement, self.graphs, self.monitor = devices, placement, graphs, monitor
        self.weights_held = weights_held or {}  # device -> bytes of weights it holds
        self.launch, self.clock = launch, clock
        self.home = devices[placement.home]
        self.whole = whole or self.home
        self.slower = slower or []  # (bucket, throughput plan's step, latency plan's step) in seconds
        self.skipped = skipped or []
        self.slots, self.context_tokens = self.home.slots, self.home.context_tokens
        self.device = f"placed:{'+'.join(devices)}"  # its name in the busy metric
        self.rows = Rows(self.slots)
        self.sizes = sorted({size for size, _ in graphs})
        self.lengths = {size: sorted(length for bucket, length in graphs if bucket == size) for size in self.sizes}
        self.away = placement.away()  # device -> the caches it keeps
        self._last_token_seconds: dict[int, float] = {}
        self._waited: dict[int, float] = {}  # slot -> its request's wait in the queue, until its first step
        self.switches, self.steps = plan_metrics(registry)
        self._switches_seen = monitor.switches

    def gates(self) -> dict[str, list[str]]:
        """Which graphs passed which gate at start: each verdict with its graphs ("bucket B policy", and
        "context L" where the bucket has shorter context buckets)."""
        found: dict[str, list[str]] = {}
        for (size, length), policies in sorted(self.graphs.items()):
            where = f"bucket {size}" + (f" context {length}" if len(self.lengths[size]) > 1 else "")
            for policy, graph in policies.items():
                found.setdefault(graph.gate or "not gated", []).append(f"{where} {policy}")
        return found

    def queued(self, slot: int, seconds: float) -> None:
        """The engine admitted the request now in ``slot`` after ``seconds`` in its queue: counted in
        the latency of its first decode step (module docstring)."""
        self._waited[slot] = seconds

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        """A prompt, or its chunk at ``start``, on the home device (backend.py's ``prefill``)."""
        row = self.rows.prefilled(slot, start + len(token_ids))
        logits = self.whole.prefill(row, token_ids, start)
        self._spread(row, range(start, start + len(token_ids)))
        self._last_token_seconds[slot] = self.clock()
        return logits

    def prefill_many(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Whole prompts in one forward on the home device (backend.py's ``prefill_many``), each spread
        as :meth:`prefill` spreads one."""
        rows = [self.rows.prefilled(slot, len(prompt)) for slot, prompt in zip(slots, prompts)]
        logits = self.whole.prefill_many(rows, prompts)
        for row, prompt in zip(rows, prompts):
            self._spread(row, range(len(prompt)))
        done = self.clock()
        self._last_token_seconds.update((slot, done) for slot in slots)
        return logits

    @torch.inference_mode()
    def _spread(self, row: int, positions: range) -> None:
        """The row's ``positions`` of the layers whose cache the plans keep away from home, copied there."""
        for device, caches in self.away.items():
            copy_rows(self.home.cache, self.devices[device].cache, caches, row, positions)

    @torch.inference_mode()
    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> torch.Tensor:
        started = self.clock()
        policy = self.monitor.plan_for_next_step(started)  # once, before the step: a switch never splits it
        caches = [backend.cache for backend in self.devices.values()]
        row, size, inputs = laid_out(self.rows, caches, slots, token_ids, positions, self.sizes)
        graph = self.graphs[size, bucket_for(max(positions) + 1, self.lengths[size])][policy]
        graph.inputs.copy_(inputs)
        self.launch(graph.built)
        if graph.twin:
            graph.logits = Bucket(size, graph.inputs, graph.length).forward(self.whole)
        done = self.clock()
        for slot in slots:
            last = self._last_token_seconds.get(slot, started)  # its prefill's end, or its previous token's
            self.monitor.finished(Finished(done, done - last + self._waited.pop(slot, 0.0), done - started))
            self._last_token_seconds[slot] = done
        self.steps.labels(policy).inc()
        self.switches.inc(self.monitor.switches - self._switches_seen)
        self._switches_seen = self.monitor.switches
        return in_engine_order(graph.logits, row)


def plan_metrics(registry: Any) -> tuple[Any, Any]:
    """The switches counter and the steps-by-policy counter, in ``registry`` (None: one of their own)."""
    from prometheus_client import CollectorRegistry, Counter

    registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
    switches = Counter("kernelfleet_serve_plan_switches", "Switches between the latency and the throughput plan.",
                       registry=registry)
    steps = Counter("kernelfleet_serve_plan_steps", "Decode steps run under each plan.", ["policy"], registry=registry)
    for policy in (LATENCY, THROUGHPUT):  # exported at 0 from the start
        steps.labels(policy)
    return switches, steps
