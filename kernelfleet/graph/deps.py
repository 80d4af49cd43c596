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

from kernelfleet.kernels.ir import Access, Launch, Program


@dataclass(frozen=True, slots=True)
class Edge:
    src: int  # the writing launch
    dst: int  # the reading launch
    buffer: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Flow:
    """Bytes [start, end) of ``buffer`` that ``dst`` reads as ``src`` last wrote them."""

    src: int
    dst: int
    buffer: int
    start: int
    end: int
    scratch: bool = False  # through an op call's own workspace (see flows)


def flows(program: Program) -> tuple[list[Flow], dict[int, list[tuple[int, int, int]]]]:
    """Every read-after-write byte range, in reader order, and who last wrote each range at the end
    (``{buffer: [(start, end, writer)]}``) — what an executor must copy between devices.

    A conservative access of a kernel inside an ATen op call (a pointer its schema does not name:
    a workspace, or a stale word that only looks like a pointer) carries data only between that
    call's own kernels: an ATen op reads and writes other calls' data only through its arguments,
    and a library's workspace holds nothing from one call to the next. So such writes go to the
    call's own scratch record, and such reads — like an ``own_reads`` access's — see only what the
    call's own kernels wrote (``Flow.scratch`` when from its scratch record). Any other read by a
    kernel of the call may see that scratch too (``aten.sort`` fills an index workspace with one
    kernel, a conservative write, and copies it into its output with a memcpy node, an exact read),
    so it gets a flow from each: from the last writer outside the scratch and from the call's own
    scratch. :func:`together` keeps such calls whole on one device, and ``plan.transfers`` delivers
    what they read from other calls before their first kernel."""
    written: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # non-overlapping, sorted
    scratch: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)  # (op call, buffer) -> same
    out: list[Flow] = []
    launches = program.launches
    for launch in launches:
        for access in launch.accesses:
            if not access.reads:
                continue
            if _scratch(launch, access) or (access.own_reads and launch.op_index is not None):
                sources = [(scratch[launch.op_index, access.buffer], True),
                           ([x for x in written[access.buffer] if launches[x[2]].op_index == launch.op_index], False)]
            else:
                sources = [(written[access.buffer], False)]
                if launch.op_index is not None:
                    sources.append((scratch.get((launch.op_index, access.buffer), []), True))
            for segments, own in sources:
                out += [Flow(writer, launch.index, access.buffer, max(start, access.offset_bytes),
                             min(end, access.end), own)
                        for start, end, writer in segments
                        if writer != launch.index and min(end, access.end) > max(start, access.offset_bytes)]
        for access in launch.accesses:
            if access.writes:
                key = (launch.op_index, access.buffer)
                if _scratch(launch, access):
                    scratch[key] = overwritten(scratch[key], access.offset_bytes, access.end, launch.index)
                else:
                    written[access.buffer] = overwritten(written[access.buffer], access.offset_bytes, access.end,
                                                        launch.index)
    return out, dict(written)


def _scratch(launch: Launch, access: Access) -> bool:
    return access.source == "conservative" and launch.op_index is not None


def together(program: Program, found: list[Flow] | None = None) -> list[tuple[int, ...]]:
    """The op calls that must run whole on one device, each as its launches in capture order: those
    whose kernels pass data through the call's own scratch (a ``Flow.scratch`` of ``found``, the
    program's :func:`flows`, computed here where not given). Their workspace bytes are known only as "from this pointer to the end of
    its buffer", so a copy of them to another device would overwrite whatever other tensors live
    there; and a workspace may hold device addresses (a grouped GEMM's problem table), which mean
    nothing on another device."""
    found = flows(program)[0] if found is None else found
    calls = {program.launches[f.dst].op_index for f in found if f.scratch}
    members: dict[int, list[int]] = defaultdict(list)
    for launch in program.launches:
        if launch.op_index in calls:
            members[launch.op_index].append(launch.index)
    return [tuple(members[c]) for c in sorted(calls)]


def dependencies(program: Program) -> list[Edge]:
    """RAW edges, one per (writer, reader, buffer), in reader order."""
    carried: dict[tuple[int, int, int], int] = defaultdict(int)
    for f in flows(program)[0]:
        carried[f.dst, f.src, f.buffer] += f.end - f.start
    return [Edge(src, dst, buffer, n) for (dst, src, buffer), n in sorted(carried.items())]


def overwritten(segments: list[tuple[int, int, int]], start: int, end: int, writer: int) -> list[tuple[int, int, int]]:
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
    """tensor-core, memory-bound or other: from the kernel's PTX when the capture had it
    (``ptx.kinds``), else from what its name says."""
    if launch.kind in ("memcpy", "memset"):
        return "memory-bound"
    if launch.work is not None:
        return launch.work
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
