"""What a served model needs of a device's memory, and how many KV-cache slots fit under a cap.

Plain arithmetic (no torch): the sizes come from the model's config (``model.footprint``), the
cap from ``--device NAME:MEMORY_GB[@GPU]`` or, without one, the memory the device has free. What
counts against the cap is what torch allocates on the device: the weights, the KV cache (the
slots), and a workspace:

* per slot, a row of logits (the model's dtype and float32) and of the attention mask;
* once, :data:`FIXED_WORKSPACE_BYTES` for a prefill's activations and the libraries' workspaces.

The CUDA context itself (a few hundred MiB, outside torch's allocator) is not in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernelfleet.errors import UsageError

GIB = 1024**3
# an estimate, not a measurement: a 4096-token prefill of an 8B Llama holds about 0.35 GiB of
# activations at once (4096 tokens x the MLP's 14336 x 3 tensors x 2 bytes); cuBLAS's workspaces the rest
FIXED_WORKSPACE_BYTES = GIB
MAX_SIZED_SLOTS = 64  # slots sized from memory stop here: past it a decode step is compute-bound, and each
# more bucket is one more graph to capture
DEVICE_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+):(?P<gb>\d+(\.\d+)?)(@(?P<gpu>\d+))?$")


@dataclass(frozen=True)
class DeviceCap:
    """``--device NAME:MEMORY_GB[@GPU]``: the device's name in the metrics, what it may hold, and
    which GPU it is."""

    name: str
    memory_bytes: int
    gpu: int = 0


def parse_device(spec: str) -> DeviceCap:
    """``NAME:MEMORY_GB[@GPU]`` (GB as 10^9 bytes, as GPU datasheets count), or UsageError."""
    match = DEVICE_SPEC.match(spec)
    if match is None or float(match["gb"]) <= 0:
        raise UsageError(f"--device takes NAME:MEMORY_GB[@GPU] (e.g. h200:40 or big:80.5@1), got {spec!r}")
    return DeviceCap(match["name"], int(float(match["gb"]) * 1e9), int(match["gpu"] or 0))


@dataclass(frozen=True)
class Footprint:
    """A model's sizes on a device: its weights, and per slot its KV cache and workspace."""

    weights_bytes: int
    kv_bytes_per_slot: int
    workspace_bytes_per_slot: int

    def needs_bytes(self, slots: int) -> int:
        """Weights, ``slots`` slots, and the workspace."""
        return self.weights_bytes + slots * self.kv_bytes_per_slot + self.workspace_bytes(slots)

    def workspace_bytes(self, slots: int) -> int:
        """The workspace of ``slots`` slots: their rows of logits and mask, and the fixed part."""
        return slots * self.workspace_bytes_per_slot + FIXED_WORKSPACE_BYTES

    def slots_under(self, cap_bytes: int) -> int:
        """The most slots whose needs fit ``cap_bytes`` (0 when not even one does)."""
        left = cap_bytes - self.weights_bytes - FIXED_WORKSPACE_BYTES
        return max(0, left // (self.kv_bytes_per_slot + self.workspace_bytes_per_slot))


def kv_bytes(layers: int, kv_heads: int, head_dim: int, context_tokens: int, dtype_bytes: int) -> int:
    """Keys and values of one slot: every layer, every position of the context."""
    return 2 * layers * kv_heads * head_dim * context_tokens * dtype_bytes


def planned_slots(footprint: Footprint, cap_bytes: int, slots: int | None, where: str) -> int:
    """``slots``, or the most that fit (at most :data:`MAX_SIZED_SLOTS`), once they fit under
    ``cap_bytes``; UsageError saying what the plan needs and what the cap allows otherwise."""
    fits = footprint.slots_under(cap_bytes)
    wanted = slots if slots is not None else max(1, min(fits, MAX_SIZED_SLOTS))
    if wanted > fits:
        need = footprint.needs_bytes(wanted)
        raise UsageError(
            f"the model does not fit {where}: {wanted} slot{'s' * (wanted != 1)} need {need / GIB:.2f} GiB (weights "
            f"{footprint.weights_bytes / GIB:.2f} GiB, KV cache {wanted * footprint.kv_bytes_per_slot / GIB:.2f} "
            f"GiB, workspace {footprint.workspace_bytes(wanted) / GIB:.2f} "
            f"GiB) and the cap allows {cap_bytes / GIB:.2f} GiB; raise the cap, or lower --slots or --context")
    return wanted


def checked_share(device: str, weights: int, cache: int, workspace: int, free: int, where: str) -> None:
    """A device's share under ``serve --plans``: the weights its plans' launches read, the KV cache
    they keep there and the workspace, against the ``free`` bytes of its GPU; UsageError saying what
    the share needs otherwise."""
    need = weights + cache + workspace
    if need > free:
        raise UsageError(f"device {device} does not fit {where}: its share of the plans needs {need / GIB:.2f} GiB "
                         f"(weights {weights / GIB:.2f} GiB, KV cache {cache / GIB:.2f} GiB, workspace "
                         f"{workspace / GIB:.2f} GiB) and {free / GIB:.2f} GiB are free; lower --slots or --context, "
                         "or plan less onto it")


def proportional_slots(total: int, weights: list[float]) -> list[int]:
    """``total`` slots over devices in proportion to ``weights`` (their memory), each at least one,
    by largest remainder (the counts add up to ``total``); UsageError when there are fewer slots than devices."""
    if total < len(weights):
        raise UsageError(f"--slots {total} cannot give each of the {len(weights)} devices a slot")
    shares = [total * w / sum(weights) for w in weights]
    counts = [max(1, int(share)) for share in shares]
    while sum(counts) < total:  # the largest remainder first
        counts[max(range(len(counts)), key=lambda i: (shares[i] - counts[i], -i))] += 1
    while sum(counts) > total:  # a device raised to its one slot is paid for by the most over its share
        counts[max((i for i in range(len(counts)) if counts[i] > 1), key=lambda i: (counts[i] - shares[i], -i))] -= 1
    return counts
