"""Replay a captured step node by node on the GPU, and watch what each node does.

The step's graph is instantiated once more with every node disabled; enabling one node at a
time replays the step in order with its real state, so each launch sees exactly the bytes it
saw in the captured run. Between nodes:

* **memory-diff**: every candidate buffer is compared with a copy taken before the node; the
  changed byte range per buffer is the node's observed write set (``checks.unsound_writes``).
* **dynamic range probe**: a kernel whose PTX is known runs, in place of its node, as the
  rewritten PTX of :mod:`kernelfleet.ptx.probe`, which records the lowest and highest address
  each memory instruction touched. The probed kernel does the kernel's work, so the state
  stays the real one.

Candidates are all buffers but the weights when they total at most ``max_bytes``; above that,
only the buffers a launch names or points at (a larger model then checks its claims, not
every byte of memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kernelfleet.graph.deps import Flow, flows
from kernelfleet.kernels.assemble import fitting
from kernelfleet.kernels.checks import Range
from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.cuda.driver import CUDA, CudaDriver
from kernelfleet.kernels.ir import Launch, Program, merged_ranges
from kernelfleet.kernels.raw import RawNode, program_nodes
from kernelfleet.ptx import probe as ptx_probe

RUN_GAP_BYTES = 64


class _DeviceBytes:
    """A zero-copy view of device memory for torch (``__cuda_array_interface__``)."""

    def __init__(self, address: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False),
                                         "version": 3}


def device_bytes(address: int, size: int, driver: CudaDriver = CUDA) -> torch.Tensor:
    """The bytes at ``address`` as a tensor on the GPU that holds them, as ``driver`` says (not the
    current one: torch would copy them there)."""
    return torch.as_tensor(_DeviceBytes(address, size), device=f"cuda:{driver.pointer_device(address)}")


@dataclass
class Observation:
    writes: dict[int, list[Range]] = field(default_factory=dict)  # launch -> changed ranges
    probed: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)  # launch -> (mode, lo, hi)
    unprobed: dict[int, str] = field(default_factory=dict)  # launch with PTX -> why no probe ran
    checked_bytes: int = 0



def preludes(program: Program) -> dict[int, list[int]]:
    """For each kernel that an earlier memset of the same ATen op call resets, those memsets
    (launch indices, in order): ``{kernel: [memsets]}``.

    cuBLAS's stream-K/split-K GEMMs (nvjet ``coop``) and cuDNN's fused attention keep tile counters
    or semaphores in a workspace that the op zeroes with a memset before each launch. Replayed
    alone, such a kernel finds the counters its previous run left and skips its work: on the H200,
    8B prefill's cuDNN attention timed 2 µs for 70 GFLOP. The profiler therefore replays each
    with its memsets (``profile/timing.py``)."""
    out: dict[int, list[int]] = {}
    pending: dict[int, list[Launch]] = {}  # op call -> its memsets so far
    for launch in program.launches:
        if launch.op_index is None:
            continue
        if launch.kind == "memset":
            pending.setdefault(launch.op_index, []).append(launch)
            continue
        resets = [m.index for m in pending.get(launch.op_index, ())
                  if any(w.buffer == a.buffer and w.offset_bytes < a.end and a.offset_bytes < w.end
                         for w in m.accesses if w.writes for a in launch.accesses)]
        if resets:
            out[launch.index] = resets
    return out


# ATen's fill kernel (zeros, full, zero_, fill_ and the zeroing inside ops such as histc), by the
# functor its mangled name carries
FILL_KERNEL = "FillFunctor"


def refills(program: Program) -> dict[int, list[int]]:
    """For each kernel that accumulates onto a constant — reads and writes bytes that a fill (a
    memset, or ATen's fill kernel: ``zeros``, ``full``, ``zero_``, the zeroing inside ``histc``) wrote
    last, as a histogram's atomics or a ``scatter_`` into fresh zeros do — those fills: ``{kernel: [fills]}``.

    Replayed alone, again and again, such a kernel adds to its own last result. On an H200, a
    Qwen2-MoE decode step's routing counts grew past the tokens there were, and the grouped GEMM
    reading their offsets stopped on a device-side assert. The profiler therefore replays each
    with its fills, as with the memsets of :func:`preludes`. Only fills: a reader-writer after a
    computed value (a split-K reduction after its GEMM) recomputes the same bytes on each replay."""
    launches = program.launches

    def modes(launch: Launch, f: Flow) -> set[str]:
        return {a.mode for a in launch.accesses if a.buffer == f.buffer and a.offset_bytes < f.end and f.start < a.end}

    out: dict[int, set[int]] = {}
    for f in flows(program)[0]:
        reader, writer = launches[f.dst], launches[f.src]
        if reader.kind != "kernel" or f.scratch:
            continue
        if "readwrite" in modes(reader, f) and modes(writer, f) == {"write"} and (
                writer.kind == "memset" or FILL_KERNEL in writer.name):
            out.setdefault(reader.index, set()).add(writer.index)
    return {k: sorted(v) for k, v in sorted(out.items())}


def replay_preludes(program: Program) -> dict[int, list[int]]:
    """What the profiler replays before each launch: its memsets (:func:`preludes`) and the writers
    it accumulates onto (:func:`refills`), in capture order."""
    memsets, writers = preludes(program), refills(program)
    return {k: sorted(set(memsets.get(k, ())) | set(writers.get(k, ()))) for k in sorted(set(memsets) | set(writers))}


def observe(captured: Captured, program: Program, *, max_bytes: int = 1 << 30, probe: bool = True,
            progress: Callable[[int], None] | None = None) -> Observation:
    """Replay the step node by node; memory-diff every launch, probe every kernel with PTX."""
    seen = Observation()
    buffers = {b.id: b for b in program.buffers}
    candidates = [b.id for b in program.buffers if b.role != "weight"]
    everything = sum(buffers[b].size_bytes for b in candidates) <= max_bytes
    snapshots: dict[int, torch.Tensor] = {}
    stream = torch.cuda.current_stream()
    captured.replay()
    torch.cuda.synchronize()

    def snapshot(b: int) -> torch.Tensor:
        if b not in snapshots:
            snapshots[b] = device_bytes(buffers[b].address, buffers[b].size_bytes, captured.driver).clone()
        return snapshots[b]

    if everything:
        for b in candidates:
            snapshot(b)
    runner = captured.replayer()
    try:
        for launch, node_index in enumerate(program_nodes(captured.raw)):
            node = captured.raw.nodes[node_index]
            mine = {a.buffer for a in program.launches[launch].accesses}
            watched = candidates if everything else sorted(mine)
            for b in watched:
                snapshot(b)
            asked = probe and node.kind == "kernel"
            why = _run_probed(captured, node, seen, launch, stream) if asked else "not asked"
            if why is not None:  # no probe ran: run the node itself
                if captured.raw.ptx.get(node.name) and why != "not asked":
                    seen.unprobed[launch] = why
                runner.one(node_index, stream.cuda_stream)
            _synchronize_after(launch, node)
            changed = []
            for b in watched:
                now = device_bytes(buffers[b].address, buffers[b].size_bytes, captured.driver)
                seen.checked_bytes += buffers[b].size_bytes
                if not torch.equal(now, snapshots[b]):
                    changed += [(b, s, e) for s, e in changed_runs(now, snapshots[b])]
                    snapshots[b].copy_(now)
            if changed:
                seen.writes[launch] = changed
            if progress:
                progress(1)
    finally:
        runner.close()
    return seen


def changed_runs(now: torch.Tensor, before: torch.Tensor, gap_bytes: int = RUN_GAP_BYTES) -> list[tuple[int, int]]:
    """Byte ranges that differ, as runs; runs closer than ``gap_bytes`` are joined (a written value
    may keep some of its bytes, which must not split one write into many)."""
    where = (now != before).nonzero().flatten()
    if where.numel() == 0:
        return []
    breaks = (where[1:] - where[:-1]) > gap_bytes
    starts = torch.cat([where[:1], where[1:][breaks]])
    ends = torch.cat([where[:-1][breaks], where[-1:]]) + 1
    return list(zip(starts.tolist(), ends.tolist()))


def saved_state(program: Program | list[Program], released: list[tuple[int, int]] = (),
                driver: CudaDriver = CUDA, *, host: bool = False) -> Callable[[], None]:
    """Copy now every byte range some launch may write (the union of the program's write accesses,
    weights included: a step that writes a weight has state there); the returned function puts
    those bytes back. Bytes no launch writes cannot change, so only written ranges cost memory; but
    a schema access of an in-place op covers its whole argument, so a decode step's one-row
    ``index_put_`` saves its whole KV cache (8B decode: 11.1 GB a capture, 8.6 GB of it cache).
    ``program`` may be several captures (a server's batch buckets over one cache): the bytes any of
    them writes are saved once, not once a capture. ``released``: [start, end) addresses freed since
    the capture, left alone; ``driver``: the one that says which GPU holds each range; ``host``: keep
    the copy in pinned host memory, not beside the bytes (a server under ``--device`` caps, whose
    device memory is its weights' and cache's: on the GPU the copy doubles the cache)."""
    state = []
    for start, end in written_spans(program if isinstance(program, list) else [program]):
        if not any(s < end and start < e for s, e in released):
            view = device_bytes(start, end - start, driver)
            state.append((view, _on_host(view) if host else view.clone()))

    def restore() -> None:
        for view, saved in state:
            view.copy_(saved)

    return restore


def _on_host(view: torch.Tensor) -> torch.Tensor:
    """A copy of the device bytes ``view`` in pinned host memory, or in pageable memory where the host
    will not pin that much (copies to and from it are then slower, the bytes the same)."""
    try:
        held = torch.empty(view.shape, dtype=view.dtype, pin_memory=True)
    except RuntimeError:
        held = torch.empty(view.shape, dtype=view.dtype)
    return held.copy_(view)


def written_spans(programs: list[Program]) -> list[tuple[int, int]]:
    """The [start, end) addresses some launch of ``programs`` may write, sorted: each buffer's write
    accesses joined where they overlap or touch, then the programs' spans joined where they share
    bytes (touching ones stay apart: two captures' buffers may be neighbouring allocations)."""
    spans = []
    for program in programs:
        buffers = {b.id: b for b in program.buffers}
        written: dict[int, list[tuple[int, int]]] = {}
        for launch in program.launches:
            for a in launch.accesses:
                if a.writes:
                    written.setdefault(a.buffer, []).append((a.offset_bytes, a.end))
        spans += [(buffers[b].address + start, buffers[b].address + end)
                  for b, ranges in written.items() for start, end in merged_ranges(ranges)]
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def stepwise_matches_graph(captured: Captured, program: Program) -> bool:
    """Do the outputs of a node-by-node replay equal, bit for bit, those of the graph replay?

    A decode step updates state in place (an SSM's state, a cache row), so each run starts from
    the same state: every buffer that is not a weight is saved first and restored before each run.
    """
    restore = saved_state(program, driver=captured.driver)
    outputs = captured.output_tensors()
    restore()
    captured.replay()
    torch.cuda.synchronize()
    reference = [t.clone() for t in outputs]
    restore()
    runner = captured.replayer()
    stream = torch.cuda.current_stream().cuda_stream
    try:
        for launch, node in enumerate(program_nodes(captured.raw)):
            runner.one(node, stream)
            _synchronize_after(launch, captured.raw.nodes[node])
    finally:
        runner.close()
    return all(torch.equal(a, b) for a, b in zip(reference, outputs))


def _synchronize_after(launch: int, node: RawNode) -> None:
    """Wait for the launch just replayed; if it lost the context, say which launch it was."""
    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:
        raise RuntimeError(f"launch {launch} ({node.kind} {node.name[:80]}) failed alone: {exc}") from exc


def _run_probed(captured: Captured, node: RawNode, seen: Observation, launch: int,
                stream: torch.cuda.Stream) -> str | None:
    """Run ``node`` as its probed PTX; None when it ran, else why it could not."""
    variants = fitting(captured.raw.ptx.get(node.name, []), node)
    texts = {v["ptx"] for v in variants}
    if len(texts) != 1:
        return "no PTX" if not texts else f"{len(texts)} PTX variants fit the launch"
    kernel = ptx_probe.instrument(texts.pop(), node.name)
    slots = torch.tensor(list(ptx_probe.initial_probe_bytes(kernel)), dtype=torch.uint8, device="cuda")
    params = [bytes.fromhex(h) for _, _, h in node.params] + [slots.data_ptr().to_bytes(8, "little")]
    captured.driver.load_and_launch(kernel.ptx, node.name, node.grid, node.block, node.shared_bytes, params,
                                    stream.cuda_stream)
    ranges = ptx_probe.decode(kernel, bytes(slots.cpu().numpy().tobytes()))
    seen.probed[launch] = [(site.mode, lo, hi) for site, lo, hi in ranges if lo is not None]
    if kernel.unprobed:
        seen.unprobed[launch] = "; ".join(kernel.unprobed)
    return None
