"""The kernel program: what a model step launches, and which bytes each launch reads and writes.

Plain data (STYLE: plans and programs are data): a capture on a GPU produces it, it is
saved as JSON, and everything after — the dependency graph, profiling, planning — reads
it on any machine. Every access says how it is known (``source``), so a user can see why
a kernel may move, and a kernel whose accesses cannot be bounded carries ``pinned`` with
the reason instead of being assumed safe.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.documents import parse, read_text, reading
from kernelfleet.errors import UsageError

ROLES = ("weight", "input", "output", "activation", "workspace", "unknown")
MODES = ("read", "write", "readwrite")
SOURCES = ("ptx-static", "ptx-dynamic", "schema", "memory-diff", "conservative", "graph-node")
KINDS = ("kernel", "memcpy", "memset")
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Buffer:
    """A device allocation (or a named part of one) the program touches."""

    id: int
    device: int
    address: int
    size_bytes: int
    role: str = "unknown"
    name: str | None = None

    def __post_init__(self) -> None:
        _check(self.role in ROLES, f"buffer {self.id}: role must be one of {ROLES}, got {self.role!r}")
        _check(self.size_bytes > 0, f"buffer {self.id}: size_bytes must be positive, got {self.size_bytes}")


@dataclass(frozen=True, slots=True)
class Access:
    """``length_bytes`` bytes from ``offset_bytes`` into a buffer, read and/or written.

    ``own_reads``: it reads only what the same ATen op call's earlier kernels wrote there (an op of
    several kernels reading back its fresh outputs), never the tensor that held those bytes before."""

    buffer: int
    offset_bytes: int
    length_bytes: int
    mode: str
    source: str
    own_reads: bool = False

    def __post_init__(self) -> None:
        _check(self.mode in MODES, f"access to buffer {self.buffer}: mode must be one of {MODES}, got {self.mode!r}")
        _check(self.source in SOURCES, f"access to buffer {self.buffer}: source must be one of {SOURCES}, got {self.source!r}")
        _check(self.offset_bytes >= 0 and self.length_bytes > 0,
               f"access to buffer {self.buffer}: need offset >= 0 and length > 0")

    @property
    def end(self) -> int:
        return self.offset_bytes + self.length_bytes

    @property
    def reads(self) -> bool:
        return self.mode in ("read", "readwrite")

    @property
    def writes(self) -> bool:
        return self.mode in ("write", "readwrite")


@dataclass(frozen=True, slots=True)
class Launch:
    """One node of the captured step, in capture order."""

    index: int
    kind: str
    name: str
    accesses: tuple[Access, ...] = ()
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    shared_bytes: int = 0
    params_hex: str | None = None  # the raw parameter bytes, as captured
    params: tuple[dict[str, Any], ...] = ()  # decoded (name/offset/size/value/pointer-to-buffer)
    op: str | None = None  # the ATen op whose dispatch produced it
    pinned: str | None = None  # why this launch must stay on its original device
    work: str | None = None  # tensor-core / memory-bound / other, when its PTX says (graph.deps.kernel_kind)
    op_index: int | None = None  # which ATen op call (in capture order) produced it; None without one

    def __post_init__(self) -> None:
        _check(self.kind in KINDS, f"launch {self.index}: kind must be one of {KINDS}, got {self.kind!r}")


@dataclass
class Program:
    buffers: list[Buffer] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)

    def __post_init__(self) -> None:
        ids = [b.id for b in self.buffers]
        _check(len(ids) == len(set(ids)), "buffer ids must be unique")
        sizes = {b.id: b.size_bytes for b in self.buffers}
        for position, launch in enumerate(self.launches):
            _check(launch.index == position, f"launch {launch.index} is at position {position}: launches must be in order")
            for a in launch.accesses:
                _check(a.buffer in sizes, f"launch {launch.index}: access to unknown buffer {a.buffer}")
                _check(a.end <= sizes[a.buffer],
                       f"launch {launch.index}: access [{a.offset_bytes}, {a.end}) beyond buffer {a.buffer} "
                       f"of {sizes[a.buffer]} bytes")

    def to_json(self) -> str:
        return json.dumps({"kernelfleet_program": FORMAT_VERSION, "buffers": [asdict(b) for b in self.buffers],
                           "launches": [asdict(launch) for launch in self.launches]}, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str = "<program>") -> Program:
        """Read ``to_json`` output; a malformed document is a UsageError naming what is wrong."""
        with reading(where, "kernel program"):
            doc = parse(text, "kernelfleet_program", FORMAT_VERSION)
            buffers = [Buffer(**b) for b in doc["buffers"]]
            launches = []
            for raw in doc["launches"]:
                raw = dict(raw)
                raw["accesses"] = tuple(Access(**a) for a in raw.get("accesses", ()))
                raw["params"] = tuple(raw.get("params", ()))
                for key in ("grid", "block"):
                    raw[key] = tuple(raw[key]) if raw.get(key) is not None else None
                launches.append(Launch(**raw))
            return cls(buffers, launches)

    @classmethod
    def load(cls, path: str | Path) -> Program:
        path = Path(path)
        text = read_text(path)
        return cls.from_json(text, str(path))


def merged_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) ranges sorted, with overlapping or touching ones joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
