"""What a capture reads off the GPU, before any interpretation: the raw capture record.

A capture on a GPU (``capture.py``) writes one :class:`RawCapture`: every node of the CUDA
graph in creation order with its raw parameter bytes, the ATen ops that produced them (with
the tensors each op read and wrote, by address), the named regions (weights, inputs,
outputs), the allocator's segments and the PTX of kernels that have it. It is committed as a
test fixture; ``assemble.py`` turns it into a :class:`~kernelfleet.kernels.ir.Program` on any
machine, so everything after the GPU is replay-tested on the CPU.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.documents import parse, reading
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import KINDS

CAPTURE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class RawNode:
    """One graph node. Kernels carry name, shape and ``params`` as (offset, size, hex bytes)."""

    kind: str  # kernel | memcpy | memset | any other node type, lower case (kept for indexing)
    name: str = ""
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    shared_bytes: int = 0
    cluster: tuple[int, int, int] | None = None
    params: tuple[tuple[int, int, str], ...] = ()
    dst: int | None = None  # memcpy / memset
    src: int | None = None  # memcpy from device memory
    length_bytes: int = 0
    value: int | None = None  # memset


@dataclass(frozen=True, slots=True)
class RawTensor:
    """A tensor an op touched: its view's byte extent and its storage, and how the op used it."""

    address: int
    extent_bytes: int
    storage_address: int
    storage_bytes: int
    mode: str  # read | write | readwrite


@dataclass(frozen=True, slots=True)
class RawOp:
    """An ATen op seen during capture and the graph nodes [first, end) it created."""

    name: str
    first: int
    end: int
    tensors: tuple[RawTensor, ...] = ()
    flops: int = 0  # useful FLOPs by PyTorch's formulas (0: an op PyTorch counts none for)
    precision: str | None = None


@dataclass(frozen=True, slots=True)
class Region:
    """A named address range: a weight, an input or an output of the captured step."""

    address: int
    size_bytes: int
    role: str
    name: str | None = None


@dataclass
class RawCapture:
    nodes: list[RawNode]
    ops: list[RawOp] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)  # allocator (address, size)
    ptx: dict[str, list[dict]] = field(default_factory=dict)  # name -> [{"ptx", "threads", "shared_bytes"}]
    about: dict[str, Any] = field(default_factory=dict)  # device, driver, torch, what was captured
    allocations: list[tuple[int, int]] = field(default_factory=list)  # allocator blocks handed out in capture

    def to_json(self) -> str:
        return json.dumps({"kernelfleet_capture": CAPTURE_FORMAT, "about": self.about,
                           "nodes": [_compact(asdict(n)) for n in self.nodes],
                           "ops": [asdict(o) for o in self.ops], "regions": [asdict(r) for r in self.regions],
                           "segments": self.segments, "allocations": self.allocations, "ptx": self.ptx})

    def save(self, path: str | Path) -> None:
        data = self.to_json().encode()
        Path(path).write_bytes(gzip.compress(data, mtime=0) if str(path).endswith(".gz") else data)

    @classmethod
    def from_json(cls, text: str, where: str = "<capture>") -> RawCapture:
        with reading(where, "raw capture"):
            doc = parse(text, "kernelfleet_capture", CAPTURE_FORMAT)
            nodes = [RawNode(**{**n, **{k: _tuple(n.get(k)) for k in ("grid", "block", "cluster")},
                                "params": tuple(tuple(p) for p in n.get("params", ()))}) for n in doc["nodes"]]
            ops = [RawOp(**{**o, "tensors": tuple(RawTensor(**t) for t in o["tensors"])}) for o in doc["ops"]]
            return cls(nodes, ops, [Region(**r) for r in doc["regions"]],
                       [tuple(s) for s in doc["segments"]], dict(doc["ptx"]), dict(doc.get("about", {})),
                       [tuple(a) for a in doc.get("allocations", ())])

    @classmethod
    def load(cls, path: str | Path) -> RawCapture:
        path = Path(path)
        try:
            data = path.read_bytes()
            text = (gzip.decompress(data) if str(path).endswith(".gz") else data).decode()
        except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: cannot read a raw capture ({exc})") from exc
        return cls.from_json(text, str(path))


def program_nodes(raw: RawCapture) -> list[int]:
    """Graph node index of each launch of the program assembled from ``raw`` (its kernels and copies,
    in graph order)."""
    return [i for i, n in enumerate(raw.nodes) if n.kind in KINDS]


def _tuple(value: Any) -> tuple | None:
    return tuple(value) if value is not None else None


def _compact(node: dict[str, Any]) -> dict[str, Any]:
    """Drop fields at their defaults so a fixture stays readable."""
    defaults = {"name": "", "grid": None, "block": None, "shared_bytes": 0, "cluster": None, "params": (),
                "dst": None, "src": None, "length_bytes": 0, "value": None}
    return {k: v for k, v in node.items() if k == "kind" or v != defaults[k]}
