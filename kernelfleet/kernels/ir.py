"""The kernel program: what a model step launches, and which bytes each launch reads and writes.

Plain data (STYLE: plans and programs are data): a capture on a GPU produces it, it is
saved as JSON, and everything after — the dependency graph, profiling, planning — reads
it on any machine. Every access says how it is known (``source``), so a user can see why
a kernel may move, and a kernel whose accesses cannot be bounded carries ``pinned`` with
the reason instead of being assumed safe.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from kernelfleet.documents import Document, document, model, one_of

ROLES = ("weight", "input", "output", "activation", "workspace", "unknown")
MODES = ("read", "write", "readwrite")
SOURCES = ("ptx-static", "ptx-dynamic", "schema", "memory-diff", "conservative", "graph-node")
KINDS = ("kernel", "memcpy", "memset")
FORMAT_VERSION = 1

# Every address, size and count a GPU produces fits 64 bits; a larger one is a corrupt file (and
# would have the assembler walk a parameter of 10^30 bytes).
Count = Annotated[int, Field(ge=0, lt=2**64)]
Positive = Annotated[int, Field(gt=0, lt=2**64)]
Dim3 = tuple[Positive, Positive, Positive]


@model("buffer", frozen=True, slots=True)
class Buffer:
    """A device allocation (or a named part of one) the program touches."""

    id: int
    device: Count
    address: Count
    size_bytes: Positive
    role: one_of("role", ROLES) = "unknown"  # type: ignore[valid-type]
    name: str | None = None


@model("access", frozen=True, slots=True)
class Access:
    """``length_bytes`` bytes from ``offset_bytes`` into a buffer, read and/or written.

    ``own_reads``: it reads only what the same ATen op call's earlier kernels wrote there (an op of
    several kernels reading back its fresh outputs), never the tensor that held those bytes before."""

    buffer: int
    offset_bytes: Count
    length_bytes: Positive
    mode: one_of("mode", MODES)  # type: ignore[valid-type]
    source: one_of("source", SOURCES)  # type: ignore[valid-type]
    own_reads: bool = False

    @property
    def end(self) -> int:
        return self.offset_bytes + self.length_bytes

    @property
    def reads(self) -> bool:
        return self.mode in ("read", "readwrite")

    @property
    def writes(self) -> bool:
        return self.mode in ("write", "readwrite")


@model("pointer", frozen=True, slots=True)
class Pointer:
    """A device pointer found in a kernel parameter: ``at`` bytes into the parameter, pointing
    ``offset_bytes`` into ``buffer``."""

    at: Count
    buffer: int
    offset_bytes: int


@model("parameter", frozen=True, slots=True)
class Param:
    """A kernel parameter as captured: its position, byte offset and size in the parameter block,
    and the pointers to program buffers its bytes hold."""

    index: Count
    offset: Count
    size: Count
    pointers: tuple[Pointer, ...] = ()


@model("launch", frozen=True, slots=True)
class Launch:
    """One node of the captured step, in capture order."""

    index: int
    kind: one_of("kind", KINDS)  # type: ignore[valid-type]
    name: str
    accesses: tuple[Access, ...] = ()
    grid: Dim3 | None = None
    block: Dim3 | None = None
    shared_bytes: Count = 0
    params_hex: str | None = None  # the raw parameter bytes, as captured
    params: tuple[Param, ...] = ()  # decoded, with the pointers to buffers found in them
    op: str | None = None  # the ATen op whose dispatch produced it
    pinned: str | None = None  # why this launch must stay on its original device
    work: str | None = None  # tensor-core / memory-bound / other, when its PTX says (graph.deps.kernel_kind)
    op_index: int | None = None  # which ATen op call (in capture order) produced it; None without one


@document("kernelfleet_program", FORMAT_VERSION, "kernel program")
class Program(Document):
    """The buffers of a captured step and its launches in capture order (``kernelfleet_program``).

    Checked as a whole: buffer ids unique, ``launches[i].index == i``, every access inside a known
    buffer."""

    buffers: list[Buffer]
    launches: list[Launch]
    # each launch is a unit of matched ops (graph/units.py: the devices captured different kernels);
    # the executor then runs each device's nodes in capture order, a copy stalling both its devices
    units: bool = False
    DUMP = {"indent": 1}

    @model_validator(mode="after")
    def _consistent(self) -> Program:
        sizes = {b.id: b.size_bytes for b in self.buffers}
        if len(sizes) != len(self.buffers):
            raise ValueError("buffers: buffer ids must be unique")
        for position, launch in enumerate(self.launches):
            if launch.index != position:
                raise ValueError(f"launches.{position}: launch {launch.index} is at position {position}: "
                                 "launches must be in order")
            for k, a in enumerate(launch.accesses):
                where = f"launches.{position}.accesses.{k}"
                if a.buffer not in sizes:
                    raise ValueError(f"{where}: launch {position}: access to unknown buffer {a.buffer}")
                if a.end > sizes[a.buffer]:
                    raise ValueError(f"{where}: launch {position}: access [{a.offset_bytes}, {a.end}) beyond "
                                     f"buffer {a.buffer} of {sizes[a.buffer]} bytes")
        return self



def merged_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) ranges sorted, with overlapping or touching ones joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out

