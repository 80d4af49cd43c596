"""What a driver reads from a graph node, as plain records (the real driver and its null twin
return the same ones)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Param:
    offset: int
    size: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class KernelNode:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    params: tuple[Param, ...]
    cluster: tuple[int, int, int] | None


@dataclass(frozen=True, slots=True)
class CopyNode:
    kind: str  # "memcpy" | "memset"
    dst: int
    length_bytes: int
    src: int | None = None  # memcpy only (device to device); None when the source is host memory
    value: int | None = None  # memset only
