"""What a capture reads off the GPU, before any interpretation: the raw capture record.

A capture on a GPU (``capture.py``) writes one :class:`RawCapture`: every node of the CUDA
graph in creation order with its raw parameter bytes, the ATen ops that produced them (with
the tensors each op read and wrote, by address), the named regions (weights, inputs,
outputs), the allocator's segments and the PTX of kernels that have it. It is committed as a
test fixture; ``assemble.py`` turns it into a :class:`~kernelfleet.kernels.ir.Program` on any
machine, so everything after the GPU is replay-tested on the CPU.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated

from pydantic import Field
from typing_extensions import Required, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from kernelfleet.documents import CONFIG, Document, document, model, one_of
from kernelfleet.kernels.ir import KINDS, MODES, Count, Dim3

CAPTURE_FORMAT = 1
HexBytes = Annotated[str, Field(pattern=r"^([0-9a-fA-F]{2})*$")]  # a parameter's bytes, two hex digits each


@model("raw node", frozen=True, slots=True)
class RawNode:
    """One graph node. Kernels carry name, shape and ``params`` as (offset, size, hex bytes)."""

    kind: str  # kernel | memcpy | memset | any other node type, lower case (kept for indexing)
    name: str = ""
    grid: Dim3 | None = None
    block: Dim3 | None = None
    shared_bytes: Count = 0
    cluster: Dim3 | None = None
    params: tuple[tuple[Count, Count, HexBytes], ...] = ()
    dst: int | None = None  # memcpy / memset
    src: int | None = None  # memcpy from device memory
    length_bytes: Count = 0
    value: int | None = None  # memset


@model("raw tensor", frozen=True, slots=True)
class RawTensor:
    """A tensor an op touched: its view's byte extent and its storage, and how the op used it."""

    address: Count
    extent_bytes: Count
    storage_address: Count
    storage_bytes: Count
    mode: one_of("mode", MODES)  # type: ignore[valid-type]


@model("raw op", frozen=True, slots=True)
class RawOp:
    """An ATen op seen during capture and the graph nodes [first, end) it created."""

    name: str
    first: Count
    end: Count
    tensors: tuple[RawTensor, ...] = ()
    flops: Count = 0  # useful FLOPs by PyTorch's formulas (0: an op PyTorch counts none for)
    precision: str | None = None


@model("region", frozen=True, slots=True)
class Region:
    """A named address range: a weight, an input or an output of the captured step."""

    address: Count
    size_bytes: Count
    role: str
    name: str | None = None


class PtxVariant(TypedDict, total=False):
    """One compiled variant of a kernel the capture found PTX for; ``threads`` per block and
    dynamic ``shared_bytes`` pick the variant a launch ran (None: unknown)."""

    __pydantic_config__ = CONFIG  # type: ignore[misc]
    ptx: Required[str]
    threads: int | None
    shared_bytes: int | None


class About(TypedDict, total=False):
    """Where and what was captured."""

    __pydantic_config__ = CONFIG  # type: ignore[misc]
    what: str  # the step, e.g. "llama-h200-decode"
    device: str  # the GPU's name, e.g. "NVIDIA H200"
    sms: int
    torch: str
    cuda: str | None


@document("kernelfleet_capture", CAPTURE_FORMAT, "raw capture")
class RawCapture(Document):
    """Everything a capture read off the GPU (``kernelfleet_capture``), saved as (gzip) JSON."""

    nodes: list[RawNode]
    ops: list[RawOp] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    segments: list[tuple[int, Count]] = field(default_factory=list)  # allocator (address, size)
    ptx: dict[str, list[PtxVariant]] = field(default_factory=dict)  # kernel name -> its variants
    about: About = field(default_factory=About)  # device, driver, torch, what was captured
    allocations: list[tuple[int, Count]] = field(default_factory=list)  # allocator blocks handed out in capture
    DUMP = {"exclude_defaults": True}  # compact: fields at their defaults left out, so a fixture stays readable



def program_nodes(raw: RawCapture) -> list[int]:
    """Graph node index of each launch of the program assembled from ``raw`` (its kernels and copies,
    in graph order)."""
    return [i for i, n in enumerate(raw.nodes) if n.kind in KINDS]

