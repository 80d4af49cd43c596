"""The GPU ``kernelfleet serve`` runs on: which one, how much memory it may use, and the cap enforced.

The one place the serve path asks torch.cuda about the device. Without ``--device`` the cap is
what the GPU has free at start; with ``--device NAME:MEMORY_GB[@GPU]`` it is that many GB, and
torch's caching allocator is held to it (``set_per_process_memory_fraction``): an allocation past
the cap fails as an out-of-memory error there, as it would on a GPU of that size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelfleet.errors import UsageError
from kernelfleet.serve.memory import GIB, DeviceCap


@dataclass(frozen=True)
class Gpu:
    """A CUDA device to serve on: torch's name for it, its name in the metrics, its cap."""

    torch_device: str
    name: str
    cap_bytes: int
    total_bytes: int
    capped: bool

    @property
    def where(self) -> str:
        """The device and its cap in words, for messages."""
        kind = "the cap of" if self.capped else "the free memory of"
        return f"under {kind} {self.name} ({self.torch_device}, {self.cap_bytes / GIB:.2f} GiB)"

    @property
    def described(self) -> str:
        """``NAME (cuda:N, X GB cap)`` or ``... GB free``, for the start-up line."""
        return f"{self.name} ({self.torch_device}, {self.cap_bytes / 1e9:.1f} GB {'cap' if self.capped else 'free'})"

    def enforce(self) -> None:
        """Hold torch's allocator on this device to the cap (nothing to do without one)."""
        if self.capped:
            torch.cuda.set_per_process_memory_fraction(self.cap_bytes / self.total_bytes, self.torch_device)


def gpu_for(cap: DeviceCap | None) -> Gpu:
    """The GPU of ``cap`` (GPU 0 without one), checked: UsageError without CUDA (the CPU mode is
    the way there), for a GPU that is not there, or a cap past the GPU's memory."""
    if not torch.cuda.is_available():
        raise UsageError(f"torch {torch.__version__} sees no CUDA device, so there is no GPU to serve on: pass --cpu "
                         "to run the model eagerly on the CPU")
    index = cap.gpu if cap is not None else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageError(f"--device: GPU {index} is not there; this machine has {count} (0 to {count - 1})")
    device = f"cuda:{index}"
    free_bytes, total_bytes = torch.cuda.mem_get_info(index)
    if cap is None:
        return Gpu(device, device, free_bytes, total_bytes, capped=False)
    if cap.memory_bytes > total_bytes:
        raise UsageError(f"--device {cap.name}: the cap of {cap.memory_bytes / 1e9:.1f} GB is more than GPU {index}'s "
                         f"{total_bytes / 1e9:.1f} GB")
    return Gpu(device, cap.name, cap.memory_bytes, total_bytes, capped=True)



def enforce(gpus: list[Gpu]) -> None:
    """Hold torch's allocator on each GPU to its caps: the sum of the caps of the ``--device``s on it
    (two on one GPU share its allocator, whose limit is one fraction a device), which must fit it."""
    for torch_device in dict.fromkeys(gpu.torch_device for gpu in gpus):
        here = [gpu for gpu in gpus if gpu.torch_device == torch_device]
        if len(here) == 1:
            here[0].enforce()
            continue
        capped_bytes, total_bytes = sum(gpu.cap_bytes for gpu in here), here[0].total_bytes
        if capped_bytes > total_bytes:
            raise UsageError(f"--device {', '.join(gpu.name for gpu in here)} on {torch_device}: their caps add up to "
                             f"{capped_bytes / 1e9:.1f} GB, more than its {total_bytes / 1e9:.1f} GB")
        torch.cuda.set_per_process_memory_fraction(capped_bytes / total_bytes, torch_device)
