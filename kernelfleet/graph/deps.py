"""Read-after-write edges between launches, with the bytes each edge carries.

Walk the launches in capture order, keeping for every buffer which launch last wrote
each byte range (a later write shadows an earlier one over the bytes it covers). A read
gets an edge from each launch whose bytes it reads, weighted by the overlap. WAR and WAW
need no edges: each device keeps its kernels in their original order (DESIGN.md, step 3),
and a plan that moves a writer ahead of a reader across devices is the planner's to
refuse, using the same byte ranges.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kernelfleet.kernels.ir import Launch, Program


@dataclass(frozen=True, slots=True)
class Edge:
    src: int  # the writing launch
    dst: int  # the reading launch
    buffer: int
    bytes: int


def dependencies(program: Program) -> list[Edge]:
    """RAW edges, one per (writer, reader, buffer), in reader order."""
    # buffer -> list of (start, end, writer), non-overlapping, sorted by start
    written: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    edges: list[Edge] = []
    for launch in program.launches:
        carried: dict[tuple[int, int], int] = defaultdict(int)
        for access in launch.accesses:
            if access.reads:
                for start, end, writer in written[access.buffer]:
                    overlap = min(end, access.end) - max(start, access.offset_bytes)
                    if overlap > 0 and writer != launch.index:
                        carried[writer, access.buffer] += overlap
        edges += [Edge(w, launch.index, b, n) for (w, b), n in sorted(carried.items())]
        for access in launch.accesses:
            if access.writes:
                written[access.buffer] = _overwrite(written[access.buffer], access.offset_bytes, access.end, launch.index)
    return edges


def _overwrite(segments: list[tuple[int, int, int]], start: int, end: int, writer: int) -> list[tuple[int, int, int]]:
    """The segments with [start, end) now written by ``writer``."""
    out = []
    for s, e, w in segments:
        if e <= start or s >= end:
            out.append((s, e, w))
            continue
        if s < start:
            out.append((s, start, w))
        if e > end:
            out.append((end, e, w))
    out.append((start, end, writer))
    return sorted(out)


TENSOR_CORE_MARKERS = ("gemm", "nvjet", "xmma", "mma", "cutlass", "matmul", "flash", "attention", "wgmma")
MEMORY_MARKERS = ("elementwise", "copy", "reduce", "softmax", "norm", "fill", "cat", "index", "gather", "scatter")


def kernel_kind(launch: Launch) -> str:
    """tensor-core, memory-bound or other, from what the name says (PTX-based kinds come later)."""
    if launch.kind in ("memcpy", "memset"):
        return "memory-bound"
    name = launch.name.lower()
    if any(m in name for m in TENSOR_CORE_MARKERS):
        return "tensor-core"
    if any(m in name for m in MEMORY_MARKERS):
        return "memory-bound"
    return "other"


def to_dot(program: Program, edges: list[Edge]) -> str:
    """Graphviz DOT: launches as nodes (pinned ones red), edges labelled with bytes."""
    lines = ["digraph program {", "  node [shape=box, fontsize=10];"]
    for launch in program.launches:
        label = f"{launch.index}: {launch.name[:40]}\\n{kernel_kind(launch)}"
        colour = ', color=red' if launch.pinned else ""
        lines.append(f'  n{launch.index} [label="{label}"{colour}];')
    for e in edges:
        lines.append(f'  n{e.src} -> n{e.dst} [label="b{e.buffer}: {e.bytes} B"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
