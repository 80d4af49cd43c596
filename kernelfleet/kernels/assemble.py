"""From a raw capture to a kernel program: buffers, pointers, and who reads and writes what.

Buffers are address ranges, not tensors: a CUDA graph replays fixed addresses, and the
allocator hands a freed block to a later tensor during capture, so two tensors may share
bytes at different times. Every range known to be a tensor's storage, an allocator block handed
out during capture, a named region or a copy's source or destination is merged with those it
overlaps into one buffer. A pointer
found in a kernel's parameters that lands in an allocator segment but in no known range
(cuBLAS's workspace, say) gets a *workspace* buffer: the free gap of the segment around it.

Pointers are found by matching every 8-byte-aligned word of the parameter bytes against the
buffers, inside by-value structs too (cuBLAS passes one of 1,720 bytes, with its tensor maps).

Each kernel's accesses then come from the best knowledge there is, and say which:

* ``ptx-static``: the kernel's PTX is known (Triton); each pointer parameter is read, written
  or both as the static analysis found, from the pointer to the end of its buffer. If the
  analysis cannot bound an access, the kernel is pinned and touches its buffers read-write.
* ``schema``: a library kernel without PTX inside an ATen op; every kernel of the op reads the
  op's inputs and writes its outputs and mutated arguments over each tensor's byte extent (a
  superset for an op of several kernels, never a subset). Every kernel after an op's first also
  reads its fresh outputs, as its earlier kernels wrote them (``own_reads``): the op's kernels may
  pass results through them (``topk`` gathers candidates into its outputs, then sorts them in
  place), and a plan that splits the op must copy them.
* ``conservative``: an aligned pointer to a buffer the op's schema does not name (a workspace):
  read-write from the pointer to the buffer's end. A kernel with neither PTX nor an op is also
  pinned, and every pointer-like word of it counts.
* ``graph-node``: memcpy and memset nodes state their exact ranges.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Access, Buffer, Launch, Param, Pointer, Program
from kernelfleet.kernels.raw import RawCapture, RawNode, RawOp
from kernelfleet.ptx.access import KernelAccess, analyze_entry
from kernelfleet.ptx.kinds import kind_of
from kernelfleet.ptx.parser import PtxSyntaxError, parse

ROLE_RANK = {"weight": 0, "input": 1, "output": 2, "activation": 3, "workspace": 4, "unknown": 5}
MERGE = {frozenset({"read"}): "read", frozenset({"write"}): "write"}
WORKSPACE_ALIGNMENT = 16  # bytes; the caching allocator hands out 512-byte aligned blocks


@dataclass(frozen=True, slots=True)
class Hit:
    """A parameter word that points into a buffer."""

    param: int
    at: int  # byte offset inside the parameter
    buffer: int
    offset_bytes: int


class Buffers:
    """Sorted, non-overlapping buffers with address lookup."""

    def __init__(self, ranges: list[tuple[int, int, str, str | None]], segments: list[tuple[int, int]]) -> None:
        merged: list[list] = []  # [start, end, role, names]
        for start, end, role, name in sorted(ranges, key=lambda r: (r[0], r[1])):
            if merged and start < merged[-1][1]:
                last = merged[-1]
                last[1] = max(last[1], end)
                last[2] = min(last[2], role, key=ROLE_RANK.__getitem__)
                last[3] |= {name} - {None}
            else:
                merged.append([start, end, role, {name} - {None}])
        self.buffers = [Buffer(i, 0, s, e - s, r, next(iter(n)) if len(n) == 1 else None)
                        for i, (s, e, r, n) in enumerate(merged)]
        self.segments = sorted(segments)
        self._segment_starts = [s for s, _ in self.segments]
        self._reindex()

    def _reindex(self) -> None:
        self.buffers.sort(key=lambda b: b.address)
        self._starts = [b.address for b in self.buffers]
        self.by_id = {b.id: b for b in self.buffers}

    def find(self, address: int) -> Buffer | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self.buffers[i].address + self.buffers[i].size_bytes:
            return self.buffers[i]
        return None

    def add_workspace(self, address: int) -> Buffer | None:
        """A workspace buffer for an address inside a segment but outside every buffer."""
        k = bisect.bisect_right(self._segment_starts, address) - 1
        if k < 0 or address >= self.segments[k][0] + self.segments[k][1]:
            return None
        seg_start, seg_end = self.segments[k][0], self.segments[k][0] + self.segments[k][1]
        i = bisect.bisect_right(self._starts, address)
        start = max([seg_start] + [b.address + b.size_bytes for b in self.buffers[:i] if b.address < address])
        end = min([seg_end] + [b.address for b in self.buffers[i:]])
        buffer = Buffer(max(self.by_id) + 1 if self.by_id else 0, 0, start, end - start, "workspace")
        self.buffers.append(buffer)
        self._reindex()
        return buffer


def assemble(raw: RawCapture, device: int = 0) -> Program:
    """The program of a raw capture (see the module docstring for how accesses are chosen)."""
    ranges = [(r.address, r.address + r.size_bytes, r.role, r.name) for r in raw.regions if r.size_bytes > 0]
    for op in raw.ops:
        ranges += [(t.storage_address, t.storage_address + t.storage_bytes, "activation", None)
                   for t in op.tensors if t.storage_bytes > 0]
    ranges += [(address, address + size, "activation", None) for address, size in raw.allocations if size > 0]
    for n in raw.nodes:
        for address in (n.dst, n.src):
            if address is not None and n.length_bytes > 0:
                ranges.append((address, address + n.length_bytes, "activation", None))
    buffers = Buffers(ranges, raw.segments)
    hits = [_hits(n, buffers) if n.kind == "kernel" else [] for n in raw.nodes]
    op_of = _op_of_node(raw)
    ptx = _PtxIndex(raw.ptx)
    launches: list[Launch] = []
    for index, node in enumerate(raw.nodes):
        if node.kind not in ("kernel", "memcpy", "memset"):
            continue  # event and empty nodes only order work; program order keeps that
        op_index = op_of.get(index)
        op = raw.ops[op_index] if op_index is not None else None
        if node.kind != "kernel":
            launches.append(Launch(len(launches), node.kind, node.kind, _copy_accesses(node, buffers),
                                   op=op.name if op else None, op_index=op_index))
            continue
        analysed, work = ptx.lookup(node)
        later = op is not None and index > op.first
        accesses, pinned = _kernel_accesses(node, hits[index], op, later, analysed, buffers)
        accesses = list(dict.fromkeys(accesses))  # a struct may hold one pointer several times
        launches.append(Launch(len(launches), "kernel", node.name, tuple(accesses), node.grid, node.block,
                               node.shared_bytes, "".join(p[2] for p in node.params), _decoded(node, hits[index]),
                               op.name if op else None, pinned, work, op_index))
    return Program(sorted((_on(b, device) for b in buffers.buffers), key=lambda b: b.id), launches)


def _on(buffer: Buffer, device: int) -> Buffer:
    return Buffer(buffer.id, device, buffer.address, buffer.size_bytes, buffer.role, buffer.name)


def _hits(node: RawNode, buffers: Buffers) -> list[Hit]:
    found = []
    for index, (_, size, hexbytes) in enumerate(node.params):
        raw = bytes.fromhex(hexbytes)
        for at in range(0, min(size, len(raw)) - 7, 8):  # the bytes there are, whatever size claims
            value = int.from_bytes(raw[at:at + 8], "little")
            if value < 4096:
                continue
            buffer = buffers.find(value) or buffers.add_workspace(value)
            if buffer is not None:
                found.append(Hit(index, at, buffer.id, value - buffer.address))
    return found


def _op_of_node(raw: RawCapture) -> dict[int, int]:
    """Node index -> index of the ATen op call (in raw.ops) that produced it."""
    owner: dict[int, int] = {}
    for k, op in enumerate(raw.ops):
        if not 0 <= op.first <= op.end <= len(raw.nodes):
            raise UsageError(f"op {op.name} claims nodes [{op.first}, {op.end}) of a {len(raw.nodes)}-node capture")
        owner.update({i: k for i in range(op.first, op.end)})
    return owner


def _copy_accesses(node: RawNode, buffers: Buffers) -> tuple[Access, ...]:
    out = []
    for address, mode in ((node.src, "read"), (node.dst, "write")):
        if address is not None and node.length_bytes > 0:
            buffer = buffers.find(address)
            out.append(Access(buffer.id, address - buffer.address, node.length_bytes, mode, "graph-node"))
    return tuple(out)


def _kernel_accesses(node: RawNode, hits: list[Hit], op: RawOp | None, later: bool,
                     kernel_ptx: KernelAccess | None, buffers: Buffers) -> tuple[list[Access], str | None]:
    def to_end(hit: Hit, mode: str, source: str) -> Access:
        size = buffers.by_id[hit.buffer].size_bytes
        return Access(hit.buffer, hit.offset_bytes, size - hit.offset_bytes, mode, source)

    if kernel_ptx is not None:
        if kernel_ptx.pinned:
            reason = "PTX analysis could not bound an access: " + "; ".join(kernel_ptx.reasons[:3])
            return [to_end(h, "readwrite", "conservative") for h in hits], reason
        modes = list(kernel_ptx.params.values())
        return [to_end(h, modes[h.param], "ptx-static") for h in hits
                if h.param < len(modes) and modes[h.param] != "unused"], None
    if op is None:
        return ([to_end(h, "readwrite", "conservative") for h in hits],
                "no PTX and no ATen op: accesses beyond its pointer parameters cannot be ruled out")
    accesses, spans = [], []
    for t in op.tensors:
        if t.extent_bytes <= 0:
            continue
        buffer = buffers.find(t.address)
        own = later and t.mode == "write"  # a fresh output, which only the op's earlier kernels wrote
        accesses.append(Access(buffer.id, t.address - buffer.address, t.extent_bytes, "readwrite" if own else t.mode,
                               "schema", own))
        spans.append((buffer.id, t.address - buffer.address, t.address - buffer.address + t.extent_bytes))
    # A pointer into no tensor of the op: a workspace the op allocated internally (cuDNN's, say).
    # Workspaces are allocator blocks, so their pointers are aligned; a word that is not 16-byte
    # aligned is a stale value in a by-value struct's padding (TensorIterator's elementwise kernels
    # and cat's pointer array carry address+1, address+9, ... there, which would otherwise make
    # every such kernel read and write to the end of some unrelated tensor).
    accesses += [to_end(h, "readwrite", "conservative") for h in hits
                 if not any(b == h.buffer and s <= h.offset_bytes < e for b, s, e in spans)
                 and (buffers.by_id[h.buffer].address + h.offset_bytes) % WORKSPACE_ALIGNMENT == 0]
    return accesses, None


def _decoded(node: RawNode, hits: list[Hit]) -> tuple[Param, ...]:
    return tuple(Param(index, offset, size, tuple(Pointer(h.at, h.buffer, h.offset_bytes) for h in hits
                                                  if h.param == index))
                 for index, (offset, size, _) in enumerate(node.params))


class _PtxIndex:
    """Kernel name -> (static access result, kind of work), from the PTX variants the capture found.

    Triton compiles one function to several variants (autotuning) under one entry name; those
    whose thread count and dynamic shared memory fit the launch are analysed and their parameter
    modes joined (read + write = readwrite), pinned if any is. Each launch shape is analysed once.
    """

    def __init__(self, variants: dict[str, list[dict]]) -> None:
        self.variants, self._cache = variants, {}

    def lookup(self, node: RawNode) -> tuple[KernelAccess | None, str | None]:
        """The joined access result (None without PTX) and the kernel's work (None without PTX or
        when the variants disagree)."""
        key = (node.name, node.block, node.shared_bytes)
        if key not in self._cache:
            self._cache[key] = self._analyse(node)
        return self._cache[key]

    def _analyse(self, node: RawNode) -> tuple[KernelAccess | None, str | None]:
        results, kinds = [], set()
        for variant in fitting(self.variants.get(node.name, ()), node):
            try:
                module = parse(variant["ptx"])
            except PtxSyntaxError:
                continue
            entries = [e for e in module.entries if e.name == node.name]
            kinds |= {kind_of(e) for e in entries}
            results += [analyze_entry(module, e) for e in entries if len(e.params) == len(node.params)]
        work = kinds.pop() if len(kinds) == 1 else None
        if not results:
            return None, work
        params = {}
        for name in results[0].params:
            modes = {r.params.get(name, "unused") for r in results} - {"unused"}
            params[name] = "unused" if not modes else MERGE.get(frozenset(modes), "readwrite")
        return KernelAccess(node.name, params, any(r.pinned for r in results),
                            [reason for r in results for reason in r.reasons]), work


def fitting(variants: list[dict], node: RawNode) -> list[dict]:
    """The PTX variants that could be the one launched: same threads per block and shared bytes."""
    threads = node.block[0] * node.block[1] * node.block[2] if node.block else None
    return [v for v in variants if v.get("threads") in (None, threads)
            and v.get("shared_bytes") in (None, node.shared_bytes)]
