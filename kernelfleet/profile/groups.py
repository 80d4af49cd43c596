"""Launches grouped by what they run, so Nsight Compute profiles each distinct kernel once per profile.

A step of an 8B model has ~2,000 launches but a few dozen distinct kernels: the same layers,
repeated. Replaying every launch under ``ncu`` (several passes each) on three profiles would take
far longer than a run can; one representative per group takes minutes.

The signature of a launch is its kind, kernel name, grid, block, dynamic shared memory, and the
*sizes* (not offsets) and modes of the byte ranges it reads and writes. The sizes matter: cuBLAS's
persistent GEMMs launch one CTA per SM whatever the shape, so name and grid alone put a 23-µs and
a 460-µs GEMM of the DiT step in one group. With the sizes, each group's first launch, counted
once per member, puts 0.3–1.9 % of a step's time in the wrong group on the compute and bandwidth
profiles of the six committed H200 cost tables; without them, 16–21 % on the prefill and DiT
steps (tests/replay/test_counters_h200.py). Offsets are left out so the 32 layers' copies of a
kernel, reading their own layer's weights, share a group.

:class:`Groups` is the mapping ``bench/profile_counters.sh`` writes beside ncu's CSV
(``<step>.groups.json``): the groups, the launches each holds, the profiles the run used and which
groups it launched on each.
"""

from __future__ import annotations

from dataclasses import field

from pydantic import model_validator
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from kernelfleet.documents import CONFIG, Document, document, model
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Count, Dim3, Launch, Program

FORMAT_VERSION = 1


def signature(launch: Launch) -> tuple:
    """What makes two launches the same work: see the module docstring."""
    sizes = tuple(sorted((a.mode, a.length_bytes) for a in launch.accesses))
    return launch.kind, launch.name, launch.grid, launch.block, launch.shared_bytes, sizes


@model("group", frozen=True, slots=True)
class Group:
    """Launches with one signature; ``launches[0]`` (the first in capture order) is the one profiled."""

    id: str
    kind: str
    name: str
    grid: Dim3 | None
    block: Dim3 | None
    shared_bytes: Count
    launches: tuple[Count, ...]

    @property
    def representative(self) -> int:
        return self.launches[0]


def group_launches(program: Program) -> list[Group]:
    """The program's launches grouped by :func:`signature`, groups in order of first launch (g0, g1, ...)."""
    members: dict[tuple, list[int]] = {}
    for launch in program.launches:
        members.setdefault(signature(launch), []).append(launch.index)
    out = []
    for n, (key, launches) in enumerate(members.items()):
        kind, name, grid, block, shared, _ = key
        out.append(Group(f"g{n}", kind, name, grid, block, shared, tuple(launches)))
    return out


class ProfileRates(TypedDict, total=False):
    """A profile of a counters run: its work partition's SMs (None: the whole GPU), its hog's, the
    GPU's, and the rates ``profile/timing.calibrate`` measured on it."""

    __pydantic_config__ = CONFIG  # type: ignore[misc]
    sms: int | None
    hog_sms: int | None
    device_sms: int | None
    gemm_flops_per_second: float
    gemv_bytes_per_second: float
    copy_bytes_per_second: float


@document("kernelfleet_counter_groups", FORMAT_VERSION, "counter groups file")
class Groups(Document):
    """The mapping of one counters run (``kernelfleet_counter_groups``).

    ``profiles``: per profile, the SMs its work partition got (None: the whole GPU), the GPU's SMs
    and its calibrated rates (``profile/timing.calibrate``); ``launched``: per profile, the groups
    whose representative ran inside the NVTX range (a run stops early at its deadline)."""

    step: str
    launches: Count
    groups: list[Group]
    profiles: dict[str, ProfileRates] = field(default_factory=dict)
    launched: dict[str, list[str]] = field(default_factory=dict)
    DUMP = {"indent": 1}

    @model_validator(mode="after")
    def _covering(self) -> Groups:
        seen = sorted(i for g in self.groups for i in g.launches)
        if seen != list(range(self.launches)):
            raise ValueError(f"groups cover launches {_span(seen)}, expected each of 0..{self.launches - 1} exactly once")
        ids = [g.id for g in self.groups]
        if len(set(ids)) != len(ids):
            raise ValueError("group ids must be unique")
        for profile, launched in self.launched.items():
            unknown = set(launched) - set(ids)
            if unknown:
                raise ValueError(f"launched.{profile}: launched unknown groups {sorted(unknown)[:3]}")
        return self

    def by_id(self) -> dict[str, Group]:
        return {g.id: g for g in self.groups}

    def check_program(self, program: Program) -> None:
        """Fail unless every launch of ``program`` is the kernel its group says (same run, same step)."""
        if len(program.launches) != self.launches:
            raise UsageError(f"the groups are of a program of {self.launches} launches, this one has "
                             f"{len(program.launches)}")
        for g in self.groups:
            for i in g.launches:
                launch = program.launches[i]
                if (launch.kind, launch.name) != (g.kind, g.name):
                    raise UsageError(f"launch {i} is {launch.name[:60]!r}, its group {g.id} says {g.name[:60]!r}: "
                                     "the groups are of another program")


def by_weight(groups: list[Group], seconds: list[float | None] | None) -> list[Group]:
    """Groups in the order a deadline-bound run should profile them: the most measured time first
    (``seconds`` per launch, e.g. a warm cost table's whole-GPU column), else the most launches."""
    if seconds is not None and len(seconds) != max((i for g in groups for i in g.launches), default=-1) + 1:
        seconds = None  # another capture of the step: its launches do not line up

    def weight(g: Group) -> float:
        if seconds is None:
            return len(g.launches)
        return sum(seconds[i] or 0.0 for i in g.launches)

    return sorted(groups, key=weight, reverse=True)


def _span(indices: list[int]) -> str:
    return f"{indices[0]}..{indices[-1]} ({len(indices)} entries)" if indices else "none"
