"""Where the layer pipeline cuts a model: contiguous stages, one a device, each under its cap.

Plain arithmetic (no torch), on sizes read from the config (``parts.stage_sizes``). Stage ``i``
holds its layers' weights and their KV cache for every slot, the embedding when it is the first,
the final norm and the head when it is the last, and a workspace: per slot, a row of logits (the
last) or of hidden states (the others) and of the attention mask; once, the prefill's
activations (memory.py's fixed workspace).

The cut is balanced by layer count: the smallest largest stage whose stages all fit. Not by each
device's speed: ``--device NAME:MEMORY_GB`` says what a device may hold, not how fast it runs (the
place half's calibration knows that, and serve does not read it), and on the devices this is
measured on, partitions of one GPU type, equal layers are equal time. Among the cuts of that
largest stage it takes the one that gives the earlier stages as many layers as fit (the greedy
below finds a cut whenever any contiguous cut fits: a stage that ends later leaves the next ones a
suffix of what they would have had).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelfleet.errors import UsageError
from kernelfleet.serve.memory import MAX_SIZED_SLOTS, Footprint, planned_slots


@dataclass(frozen=True)
class StageSizes:
    """A model's sizes, part by part: the embedding, each decoder layer, the final norm and head;
    per slot, one layer's keys and values, and a row of logits or of hidden states (with the mask)."""

    embedding_bytes: int
    layer_bytes: list[int]
    head_bytes: int
    kv_bytes_per_slot_layer: int
    logits_bytes_per_slot: int
    hidden_bytes_per_slot: int

    def stage(self, layers: range, first: bool, last: bool) -> Footprint:
        """What a stage of ``layers`` holds (the first also the embedding, the last the head)."""
        weights = sum(self.layer_bytes[i] for i in layers) + first * self.embedding_bytes + last * self.head_bytes
        return Footprint(weights, len(layers) * self.kv_bytes_per_slot_layer,
                         self.logits_bytes_per_slot if last else self.hidden_bytes_per_slot)


def described(layers: range, first: bool, last: bool) -> str:
    """``layers 0-15 and the embedding``: what a stage holds, in words."""
    parts = [f"layers {layers.start}-{layers.stop - 1}", *["the embedding"] * first, *["the norm and head"] * last]
    return f"{', '.join(parts[:-1])} and {parts[-1]}" if len(parts) > 1 else parts[0]


def cut(sizes: StageSizes, caps_bytes: list[int], slots: int | None, wheres: list[str]) -> tuple[list[range], int]:
    """The stages' layers (module docstring) and the slots every stage holds: ``slots``, or the most
    that fit each stage (at most :data:`MAX_SIZED_SLOTS`). UsageError in one line when no cut fits:
    it names the first stage of the even cut that does not fit, what it needs and what its cap
    (``wheres[i]``, "under the cap of ...") allows."""
    count, stages = len(sizes.layer_bytes), len(caps_bytes)
    if not 2 <= stages <= count:
        raise UsageError(f"--strategy pipeline cuts the model's {count} layers into one stage a --device: it takes "
                         f"2 to {count} --device, got {stages}")
    need = slots or 1
    for largest in range(-(-count // stages), count + 1):
        layers = _greedy(sizes, caps_bytes, need, largest)
        if layers is not None:
            break
    else:  # no cut fits: say why for the even one
        layers = [range(count * i // stages, count * (i + 1) // stages) for i in range(stages)]
    fitting = []
    for i, (stage, cap) in enumerate(zip(layers, caps_bytes)):
        first, last = i == 0, i == stages - 1
        where = f"as stage {i + 1} of {stages} ({described(stage, first, last)}) {wheres[i]}"
        fitting.append(planned_slots(sizes.stage(stage, first, last), cap, slots, where))
    return layers, slots or min(min(fitting), MAX_SIZED_SLOTS)


def _greedy(sizes: StageSizes, caps_bytes: list[int], slots: int, largest: int) -> list[range] | None:
    """Stages of at most ``largest`` layers that each fit ``slots`` under their caps, each taking as
    many layers as fit (leaving every later stage one at least); None when there is none."""
    count, stages, start, layers = len(sizes.layer_bytes), len(caps_bytes), 0, []
    for i, cap in enumerate(caps_bytes):
        last = i == stages - 1
        most = count - start if last else min(largest, count - start - (stages - 1 - i))
        take = most
        while take > 0 and sizes.stage(range(start, start + take), i == 0, last).slots_under(cap) < slots:
            if last:  # the last stage takes what is left, or nothing fits
                return None
            take -= 1
        if take == 0 or take > largest:
            return None
        layers.append(range(start, start + take))
        start += take
    return layers
