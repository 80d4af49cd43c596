"""Device profiles: what a kernel runs on — a whole GPU, or a green-context partition of one.

A partition (a CUDA green context) limits SMs only; memory bandwidth falls only because few SMs
cannot pull it all. A *bandwidth-poor* device therefore needs a co-running bandwidth hog in a
separate partition: copies in a loop, from a thread and stream of its own (a hog on another
stream of the same partition just time-shares and changes nothing; DESIGN.md, Facts). The work
and hog partitions are carved from one chain of splits (the driver's ``green_streams``)
so they never share an SM, and profiles open at the same time on one GPU take SM groups past
each other's (before 2026-12-01 each profile's split started at SM 0, so the "disjoint" pair
a:64 + b:32 of one H200 shared 32 SMs); torch work runs on a partition through its stream. Clocks, power
limits and MIG are never touched.

Partitions live as long as the process, each shape made once and reused: in one H200 run, a
process that had dropped torch's green contexts after profiling hit an "unspecified launch
failure" in its next graph replay (not reproduced in isolation; the checks now run in processes of
their own anyway).

The emulated complementary pair is chosen by calibration (``profile/calibration.py``): on an H200
the closest to L40S + A100 was 56 SMs + a 64-SM hog against 32 SMs alone (tests/data/h200-capture).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch

from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver

SM_GRANULE = 8  # Hopper hands out partitions in multiples of 8 SMs (DESIGN.md, Facts)
HOG_BYTES = 1 << 30
# What kernels a device captures a step with (DESIGN, "what emulation on one GPU type can show"):
# its libraries' own choice, or SDPA held to one of its other backends, as a device of another
# architecture would pick other kernels for the same ops.
KERNELS = ("default", "math-attention", "efficient-attention")


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """``sms=None``: the whole GPU. ``hog_sms``: SMs of a co-running copy loop, or None.
    ``kernels``: which kernels the step is captured with there (:data:`KERNELS`)."""

    name: str
    sms: int | None = None
    hog_sms: int | None = None
    device: int = 0
    kernels: str = "default"

    def __post_init__(self) -> None:
        if self.kernels not in KERNELS:
            raise UsageError(f"profile {self.name}: kernels {self.kernels!r}: expected one of {', '.join(KERNELS)}")
        for label, value in (("sms", self.sms), ("hog_sms", self.hog_sms)):
            if value is not None and (value <= 0 or value % SM_GRANULE):
                raise UsageError(f"profile {self.name}: {label} must be a positive multiple of {SM_GRANULE}, got {value}")
        if self.hog_sms is not None and self.sms is None:
            raise UsageError(f"profile {self.name}: a hog needs a work partition (give sms)")


def choosing_kernels(kernels: str) -> AbstractContextManager:
    """Where a step is warmed up and captured with ``kernels`` (:data:`KERNELS`)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"math-attention": SDPBackend.MATH, "efficient-attention": SDPBackend.EFFICIENT_ATTENTION}.get(kernels)
    return nullcontext() if backend is None else sdpa_kernel(backend)


# green contexts by (driver, GPU, first SM group, work SMs, hog SMs), each made once (module docstring)
_PARTITIONS: dict[tuple[CudaDriver, int, int, int, int], list[tuple[object, int, int]]] = {}
# the SM groups that open profiles hold, per (driver, GPU): first group -> groups
_HELD: dict[tuple[CudaDriver, int], dict[int, int]] = {}


def sm_groups(spec: ProfileSpec) -> int:
    """SM groups (of :data:`SM_GRANULE`) a profile's partitions take: none for the whole GPU."""
    return sum(-(-n // SM_GRANULE) for n in (spec.sms, spec.hog_sms) if n)


def _first_free(held: dict[int, int], need: int) -> int:
    """The lowest first group of ``need`` groups that no held range overlaps."""
    first = 0
    for start, count in sorted(held.items()):
        if first + need <= start:
            break
        first = max(first, start + count)
    return first


def _partitions(spec: ProfileSpec, driver: CudaDriver, first_group: int | None) -> tuple[int, list]:
    """Where ``spec``'s partitions start and what they are: at ``first_group``, or past the groups
    that the profiles open in this process hold on its GPU, so profiles running together never
    share an SM (each split of a GPU starts at its first SM: ``green_streams``)."""
    total = torch.cuda.get_device_properties(spec.device).multi_processor_count
    wanted = [n for n in (spec.sms, spec.hog_sms) if n]
    held = _HELD.setdefault((driver, spec.device), {})
    first = _first_free(held, sm_groups(spec)) if first_group is None else first_group
    if (first + sm_groups(spec)) * SM_GRANULE > total:
        beside = f" beside the {first * SM_GRANULE} SMs of the profiles that run with it" if first else ""
        raise UsageError(f"profile {spec.name}: {sum(wanted)} SMs asked{beside} on GPU {spec.device}, which has "
                         f"{total}: ask for fewer SMs in all")
    key = (driver, spec.device, first, spec.sms or 0, spec.hog_sms or 0)  # a twin's partitions are not the GPU's
    if key not in _PARTITIONS:
        torch.cuda.init()
        _PARTITIONS[key] = driver.green_streams(spec.device, wanted, SM_GRANULE, first)
    return first, _PARTITIONS[key]


class DeviceProfile:
    """A running profile: ``with DeviceProfile(spec) as p, p.active() as stream: ...``; ``driver``
    carves its partitions."""

    def __init__(self, spec: ProfileSpec, driver: CudaDriver = CUDA, first_group: int | None = None) -> None:
        self.spec, self.driver, self.first_group = spec, driver, first_group
        self._held_at: int | None = None  # the first SM group this open profile holds
        self.sms: int | None = None  # SMs the work partition actually got
        self.context: object | None = None  # the work partition's CUcontext (None: the whole GPU)
        self._streams: list[torch.cuda.Stream] = []
        self._stop = threading.Event()
        self._hog: threading.Thread | None = None
        self.hog_bytes_per_second: float | None = None

    def __enter__(self) -> DeviceProfile:
        if self.spec.sms is None:  # a stream of its own: two whole-GPU profiles timed together run side by side
            self._streams = [torch.cuda.Stream(device=self.spec.device)]
            return self
        self._held_at, parts = _partitions(self.spec, self.driver, self.first_group)
        _HELD[self.driver, self.spec.device][self._held_at] = sm_groups(self.spec)
        self.context, self.sms = parts[0][0], parts[0][2]
        self._streams = [torch.cuda.ExternalStream(stream, device=self.spec.device) for _, stream, _ in parts]
        if self.spec.hog_sms:
            self._hog = threading.Thread(target=self._run_hog, daemon=True, name=f"hog-{self.spec.name}")
            self._hog.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._hog is not None:
            self._hog.join()
        torch.cuda.synchronize(self.spec.device)
        if self._held_at is not None:
            del _HELD[self.driver, self.spec.device][self._held_at]
            self._held_at = None

    @contextmanager
    def active(self) -> Iterator[torch.cuda.Stream]:
        """The stream work on this profile runs on, made current for torch."""
        stream = self._streams[0]
        with torch.cuda.device(self.spec.device), torch.cuda.stream(stream):
            yield stream

    def _run_hog(self) -> None:
        torch.cuda.set_device(self.spec.device)
        stream = self._streams[1]
        with torch.cuda.stream(stream):
            src = torch.empty(HOG_BYTES, dtype=torch.uint8, device=f"cuda:{self.spec.device}")
            dst = torch.empty_like(src)
            start, end, copies = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), 0
            start.record(stream)
            while not self._stop.is_set():
                for _ in range(4):
                    dst.copy_(src)
                copies += 4
                stream.synchronize()
            end.record(stream)
            end.synchronize()
        self.hog_bytes_per_second = 2 * HOG_BYTES * copies / (start.elapsed_time(end) / 1e3)
