"""The correctness gate (DESIGN, place step 7): a placement must give the single-device outputs
before any figure of it is reported (runs on GPUs).

A :class:`Gate` holds ``slots`` micro-batches of a step, each with a replica per device
(``runtime/replicas.py``), and each slot's references: every capture's own graph replay on its
whole GPU, from the captured state. :meth:`Gate.graph` builds a strategy's graph after every slot's
placement passed the validator (``runtime/plans.py``); :meth:`Gate.gate` runs it once from the
captured state with the outputs zeroed (so only a run that writes them can match) and answers
:data:`IDENTICAL` when each slot's outputs at its home equal its own capture's replay bit for bit,
else what differs.

Where the devices captured different kernels (units, ``graph/units.py``) bits cannot match, and the
gate is :func:`agreement` with the home device's own run instead: logits cosine at least
:data:`COSINE_FLOOR` at every position, and every position whose argmax differs a near-tie of the
reference (its top-2 margin at most :attr:`Agreement.near_tie_bound`); for a decode step
(``workloads.steps.Decode``) over :data:`DECODE_STEPS` teacher-forced steps as well, both runs fed
the prompt's own tokens, and a free-running greedy decode from the same start is reported beside the
reference's. Every verdict says which gate it passed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.model import Device
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec
from kernelfleet.runtime import plans
from kernelfleet.runtime.executor import Built, Replica, Slot, build, run
from kernelfleet.runtime.replicas import aligned, capture_each, differing_elements, restore_all

if TYPE_CHECKING:
    from kernelfleet.workloads.steps import Step

IDENTICAL = "identical"
WITHIN = "within tolerance"
COSINE_FLOOR = 0.999  # DESIGN, "Place, second shape"
NEAR_TIE_QUANTILE = 0.999
DECODE_STEPS = 8


@dataclass(frozen=True, slots=True)
class Agreement:
    """How a run's logits agree with the reference's, position by position (last dim: vocabulary).

    ``near_tie_bound``: twice the run's own 99.9th-percentile |difference|. Two logits can swap
    only where their reference margin is at most the sum of their two differences; a swap at a
    margin above twice what 99.9 % of the logits differ by needs an error at that position beyond
    the run's rounding — a fault, not a near-tie. Measured on an H200 (a random-weight Llama,
    cuDNN against math attention, 128 positions): 99.9th percentile 0.0078, so a bound of 0.0156;
    its one flip sat at a margin of 0.0039 (tests/data/h200-variants)."""

    min_cosine: float
    max_abs_difference: float
    argmax_agreement: float
    positions: int
    argmax_differs_at: int
    reference_margin_where_argmax_differs: tuple[float, ...]
    near_tie_bound: float

    @property
    def passed(self) -> bool:
        return self.min_cosine >= COSINE_FLOOR and all(m <= self.near_tie_bound
                                                       for m in self.reference_margin_where_argmax_differs)

    def __str__(self) -> str:
        flips = self.reference_margin_where_argmax_differs
        worst = f", largest flip margin {max(flips):.4g} vs near-tie bound {self.near_tie_bound:.4g}" if flips else ""
        return (f"{WITHIN if self.passed else 'outside tolerance'}: min cosine {self.min_cosine:.6f} "
                f"(floor {COSINE_FLOOR}), max |d| {self.max_abs_difference:.4g}, argmax agreement "
                f"{self.argmax_agreement:.2%} ({self.argmax_differs_at} of {self.positions} positions{worst})")


def agreement(reference: torch.Tensor, output: torch.Tensor) -> Agreement:
    """The :class:`Agreement` of ``output`` with ``reference`` (same shape; the last dim the classes)."""
    a = reference.float().reshape(-1, reference.shape[-1] if reference.dim() else 1)
    b = output.float().reshape(a.shape)
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    difference = (a - b).abs().flatten()
    k = max(1, round(NEAR_TIE_QUANTILE * difference.numel()))
    top2 = a.topk(min(2, a.shape[-1]), dim=-1).values
    margin = top2[:, 0] - top2[:, -1]
    differ = a.argmax(-1) != b.argmax(-1)
    return Agreement(float(cosine.min()), float(difference.max()), float(1 - differ.float().mean()), int(a.shape[0]),
                     int(differ.sum()), tuple(sorted(float(m) for m in margin[differ])),
                     2 * float(difference.kthvalue(k).values))


class Gate:
    """Replicas of the step per slot and device, their references, the step's Problem (what plans
    are checked against) and the gate. ``with gate:`` runs each device on its profile.

    ``make_step(torch device, seed)``: the step, slot k seeded k; ``profiles``: the devices by the
    names the plans use, the first the default home; ``costs``: the table the plans were made from,
    or None; ``progress``: wraps the loop of captures, every slot of one device, then the next's (e.g. a
    progress bar)."""

    def __init__(self, make_step: Callable[[str, int], Step], profiles: dict[str, ProfileSpec], slots: int,
                 costs: CostTable | None = None,
                 progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda each: each) -> None:
        self.devices = list(profiles)
        self.restores: list[Callable[[], None]] = []
        captured: list[dict[str, Replica]] = [{} for _ in range(slots)]
        # each device's slots captured one after another, so its memory is allocated together, as on a
        # GPU of its own: with the partitions' captures interleaved, a's free graph ran 6-8 % slower on an
        # H100 than over captures of a alone (docs/validation/place-h200-pairs.md, "The free-slot gap was
        # bench disagg's memory layout")
        for name, slot in progress([(name, slot) for name in profiles for slot in range(slots)]):
            replicas, restores = capture_each(make_step, {name: profiles[name].device}, slot,
                                              {name: profiles[name].kernels})
            captured[slot].update(replicas)
            self.restores += restores
        self.slots: list[dict[str, Replica]] = [aligned(replicas) for replicas in captured]
        self.reset()
        self.references = []
        for replicas in self.slots:  # each capture's own graph replay, whole GPU, from the captured state
            self._replay(replicas, profiles)
            self.references.append({d: [t.clone() for t in r.captured.output_tensors()] for d, r in replicas.items()})
        self.reset()
        self._replays_alike(profiles)
        self.profiles = {name: DeviceProfile(spec) for name, spec in profiles.items()}
        memory = {name: torch.cuda.get_device_properties(spec.device).total_memory for name, spec in profiles.items()}
        self.problem = plans.problem(self.program, [Device(d, memory[d]) for d in self.devices], costs)

    def reset(self) -> None:
        restore_all(self.restores)

    @staticmethod
    def _replay(replicas: dict[str, Replica], profiles: dict[str, ProfileSpec]) -> None:
        for name, replica in replicas.items():
            with torch.cuda.device(profiles[name].device):
                replica.captured.replay()
        torch.cuda.synchronize()

    def _replays_alike(self, profiles: dict[str, ProfileSpec]) -> None:
        """The step contract: a replay from the saved state gives the outputs the last one gave, so
        the gate has a reference to compare with. UsageError naming what differs otherwise."""
        for k, replicas in enumerate(self.slots):
            self._replay(replicas, profiles)
            for name, replica in replicas.items():
                wrong = differing_elements(self.references[k][name], replica.captured.output_tensors())
                if wrong:
                    raise UsageError(replays_differ(replica.captured.raw.about.get("what", "the step"), name, wrong))
        self.reset()

    def __enter__(self) -> Gate:
        for name, profile in self.profiles.items():
            profile.__enter__()
            for replicas in self.slots:
                replicas[name].context = profile.context
        return self

    def __exit__(self, *exc: object) -> None:
        for profile in self.profiles.values():
            profile.__exit__(*exc)

    @property
    def program(self) -> Program:
        """The step as the default home captured it: what plans are checked against."""
        return self.slots[0][self.devices[0]].program

    def graph(self, name: str, assignments: list[list[str]], homes: list[str], **options) -> Built:
        """The graph of strategy ``name`` over the first ``len(assignments)`` slots (slot k: launch i
        on ``assignments[k][i]``, outputs at ``homes[k]``), once every slot passed the validator;
        ``options`` as ``executor.build``'s, state resident by default. ``release`` it."""
        plans.check_slots(self.problem, name, assignments, homes)
        used = self.slots[:len(assignments)]
        options = {"resident_state": True, **options}
        if self.units:
            # A unit's launches use scratch memory the home capture does not know of, so its device's
            # nodes run in capture order, each copy between them (the conservative schedule): each
            # device then touches its memory as its own capture did.
            options["overlap"] = False
        return build([Slot(r, a, h) for r, a, h in zip(used, assignments, homes)], **options)

    def clear_outputs(self, homes: list[str]) -> None:
        """Zero the outputs of slot k at ``homes[k]``, so only a run that writes them can match."""
        for replicas, home in zip(self.slots, homes):
            zero(replicas[home].captured.output_tensors())

    def differing(self, homes: list[str]) -> dict[int, int]:
        """Elements of slot k's outputs at ``homes[k]`` that differ from its reference, for the
        slots where any does."""
        wrong = {k: differing_elements(self.references[k][home], replicas[home].captured.output_tensors())
                 for k, (replicas, home) in enumerate(zip(self.slots, homes))}
        return {k: n for k, n in wrong.items() if n}

    @property
    def units(self) -> bool:
        """The devices captured different kernels: plans place units, and the gate is a tolerance."""
        return self.slots[0][self.devices[0]].units is not None

    def agreements(self, homes: list[str]) -> list[Agreement]:
        """Each slot's outputs at ``homes[k]`` against its reference, output by output."""
        return [agreement(ref, out) for k, (replicas, home) in enumerate(zip(self.slots, homes))
                for ref, out in zip(self.references[k][home], replicas[home].captured.output_tensors())]

    def gate(self, built: Built, homes: list[str], stream: torch.cuda.Stream) -> str:
        """Run ``built`` once from the captured state, outputs zeroed: :data:`IDENTICAL` when every
        slot's outputs equal its own single-device replay bit for bit; with units, the tolerance
        (module docstring) of the least agreeing output; else what differs."""
        self.reset()
        self.clear_outputs(homes)
        run(built, stream.cuda_stream)
        stream.synchronize()
        wrong = self.differing(homes)
        if not wrong or not self.units:
            return verdict(wrong)
        said = tolerance(self.agreements(homes))
        if not passed(said) or self.slots[0][homes[0]].decode is None:
            return said
        return decode_gate(said, self.decode_verdict(lambda: run(built, stream.cuda_stream), homes[0], stream))

    def decoded(self, step: Callable[[], None], home: str, stream: torch.cuda.Stream, forced: bool,
                steps: int = DECODE_STEPS) -> tuple[torch.Tensor, list[list[int]]]:
        """:func:`decode_steps` of slot 0 at ``home``, each step ``step()``, from the captured state
        and back to it."""
        replica = self.slots[0][home]
        self.reset()
        try:
            return decode_steps(step, replica.captured.args, replica.decode,
                                lambda: replica.captured.output_tensors()[0], forced, steps,
                                lambda: torch.cuda.synchronize(stream.device))
        finally:
            self.reset()

    def decode_verdict(self, step: Callable[[], None], home: str, stream: torch.cuda.Stream) -> tuple[bool, str]:
        """The multi-step part of the gate (module docstring): passed, and what it found."""
        replica = self.slots[0][home]

        def reference() -> None:
            with torch.cuda.device(stream.device):
                replica.captured.replay()

        forced = agreement(self.decoded(reference, home, stream, True)[0], self.decoded(step, home, stream, True)[0])
        return decode_report(forced, self.decoded(reference, home, stream, False)[1],
                             self.decoded(step, home, stream, False)[1])


def decode_report(forced: Agreement, ref_tokens: list[list[int]], tokens: list[list[int]]) -> tuple[bool, str]:
    """The multi-step gate's verdict (module docstring): passed, and what it found, from the
    teacher-forced steps' agreement and the free-running greedy tokens of the reference and the plan."""
    same = sum(a == b for a, b in zip(ref_tokens, tokens))
    flips = forced.reference_margin_where_argmax_differs
    return forced.passed, (
        f"teacher-forced over {len(tokens)} decode steps: min cosine {forced.min_cosine:.6f}, argmax agreement "
        f"{forced.argmax_agreement:.2%}{f', largest flip margin {max(flips):.4g}' if flips else ''} (near-tie "
        f"bound {forced.near_tie_bound:.4g}); free-running greedy: {same} of {len(tokens)} steps chose the "
        f"reference's tokens (last step: reference {ref_tokens[-1]}, placed {tokens[-1]})")


def decode_gate(said: str, over: tuple[bool, str]) -> str:
    """A decode step's verdict: the one-step tolerance ``said`` with the multi-step ``over``
    (:func:`decode_report`) beside it, or why it failed."""
    ok, found = over
    return f"{said}; {found}" if ok else f"outside tolerance over decode steps: {found}; one step {said}"


def replays_differ(step: str, device: str, elements: int) -> str:
    """What a step that does not replay alike is told (the step contract of docs/place.md)."""
    return (f"{step}: two replays on {device} from the same saved state differ in {elements} output elements: the "
            "step reads something a replay does not put back (dropout or sampling in the step, a random generator, "
            "an input changed outside it); build it in eval mode with its inputs fixed")


def zero(outputs: Iterable[torch.Tensor]) -> None:
    """Zero a capture's ``outputs``, inference tensors too (a step made under ``torch.inference_mode``,
    as the server's decode step is, returns them; outside that mode they refuse an in-place write)."""
    with torch.inference_mode():
        for tensor in outputs:
            tensor.zero_()


def decode_steps(step: Callable[[], None], args: tuple, decode: Any, output: Callable[[], torch.Tensor], forced: bool,
                 steps: int, sync: Callable[[], None] = lambda: None) -> tuple[torch.Tensor, list[list[int]]]:
    """Logits (steps × batch rows) and greedy tokens of ``steps`` decode steps, each ``step()`` with
    the new token (and position) written into ``args`` (``decode``: a ``workloads.steps.Decode``)
    and read back from ``output()``, fed the prompt's tokens (``forced``) or, after the first, each
    step's own greedy choice. A cache of positions decodes the prompt's last ``steps`` positions
    again (the last one the step's own); a recurrent step goes on from its state, the first step fed
    its own token and the next ones the prompt's first. ``args`` are left as they came."""
    token = args[decode.token]
    position = None if decode.recurrent else args[decode.position]
    kept = token.clone(), None if position is None else position.clone()
    if position is None:
        positions, feeds = range(steps), [kept[0]] + [decode.prompt[:, k:k + 1] for k in range(steps - 1)]
    else:
        last = int(position.reshape(-1)[0])
        positions = range(max(0, last - steps + 1), last + 1)
        # the prompt's tokens at each position; after the prompt, the step's own new token
        feeds = [decode.prompt[:, p:p + 1] if p < decode.prompt.shape[1] else kept[0] for p in positions]
    logits, chosen = [], []
    feed = feeds[0]
    try:
        for k, p in enumerate(positions):
            token.copy_(feed)
            if position is not None:
                position.fill_(p)
            step()
            sync()
            out = output()
            logits.append(out.detach().float().reshape(-1, out.shape[-1]).clone())
            greedy = out[:, -1:].argmax(-1).to(token.dtype)
            chosen.append(greedy.flatten().tolist())
            feed = feeds[k + 1] if forced and k + 1 < len(feeds) else greedy
    finally:
        token.copy_(kept[0])
        if position is not None:
            position.copy_(kept[1])
    return torch.cat(logits), chosen


def tolerance(found: list[Agreement]) -> str:
    """The tolerance gate's verdict over several outputs' agreements: the first that fails, else the
    least agreeing (its min cosine the lowest)."""
    failed = [a for a in found if not a.passed]
    return str(failed[0] if failed else min(found, key=lambda a: a.min_cosine))


def single_step_verdict(references: list[torch.Tensor], outputs: list[torch.Tensor], units: bool) -> str:
    """One step's outputs against their references: :data:`IDENTICAL` bit for bit; where the devices
    run different kernels (``units``), the tolerance of :func:`agreement`; else what differs."""
    wrong = differing_elements(references, outputs)
    if not wrong or not units:
        return verdict({0: wrong} if wrong else {})
    return tolerance([agreement(r, o) for r, o in zip(references, outputs)])


def passed(verdict_: str) -> bool:
    """The gate let the plan through: bit for bit, or within the tolerance for other kernels."""
    return verdict_ == IDENTICAL or verdict_.startswith(WITHIN)


def verdict(wrong: dict[int, int]) -> str:
    """The gate's answer given the differing elements of each slot that has any."""
    return f"outputs differ from the single-device run (slot: elements) {wrong}" if wrong else IDENTICAL
