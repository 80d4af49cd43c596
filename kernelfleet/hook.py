"""Opt-in: a few lines in a training or inference script hand the job's useful FLOPs to
the local agent, which then reports the job's MFU beside its OFU (raw and tile-corrected)
and flags a job whose own MFU figure disagrees with the counters (the OFU paper found
two framework FLOP-count bugs this way).

    from kernelfleet.hook import Tracker

    tracker = Tracker(reported_mfu=lambda: trainer.mfu)      # reported_mfu is optional
    for batch in loader:
        with tracker.step():
            loss = model(batch); loss.backward(); optimizer.step()

It needs PyTorch (the job has it; the agent does not). FLOPs come from PyTorch's own formulas (``torch.utils.flop_counter.flop_registry``:
matmuls, convolutions, attention, forward and backward), counted per precision from
the operands' dtype, with the GEMM shapes kept for the tile correction. Counting runs
inside a ``TorchDispatchMode``, so it costs host time on every op: enable it on a
sample of steps (``every``).

The tile correction. A GEMM kernel computes whole tiles, so on shapes that are not tile
multiples the tensor pipes (and OFU) do more work than the model's FLOPs. On the first
counted step, and every ``profile_every``-th counted step after it, the hook also runs
``torch.profiler`` around the step, pairs each matmul the dispatch mode saw with the GEMM
kernel that ran it (launch order), reads the kernel's tile from its name
(:mod:`kernelfleet.ofu.kernel_tiles`) and reports the step's executed FLOPs beside its
useful ones. That step is not timed: the profiler slows it.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import time
import urllib.request
from collections import Counter
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from kernelfleet.errors import UsageError
from kernelfleet.flops import MATMUL_OPS, Call, FlopCount
from kernelfleet.ofu.kernel_tiles import executed_flops_of_kernel

# A kernel launched by a matmul op is its GEMM when its name says so; the memsets and split-K
# reductions cuBLAS launches beside it do not.
_GEMM_WORDS = ("gemm", "gemv", "nvjet", "xmma", "cutlass")


# --- the tile correction: kernels from the profiler, paired with the matmuls -----------------


@dataclass(frozen=True, slots=True)
class Launch:
    """A device kernel the profiler saw, and the ATen op (``aten::mm``) whose call launched it."""

    op: str | None
    kernel: str


@dataclass(slots=True)
class KernelTrace:
    """What a profiled step launched; ``problem`` says why it is empty when profiling failed."""

    launches: list[Launch] = field(default_factory=list)
    problem: str | None = None


class NoCorrection(Exception):
    """Why a profiled step gives no tile correction; the report carries the reason."""


def launches_of(events: Iterable[Any]) -> list[Launch]:
    """Device kernels in launch order, each with its op, from ``torch.profiler``'s events:
    the profiler hangs every kernel on the CPU op that was innermost when it was launched."""
    ops = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.kernels),
                 key=lambda e: e.time_range.start)
    return [Launch(e.name, k.name) for e in ops for k in e.kernels]


def gemm_dims(op: str, shapes: Sequence[Sequence[int]]) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of torch's ``A[.., M, K] @ B[.., K, N]`` from a matmul op's operand shapes."""
    a, b = shapes[1:3] if op in ("addmm", "baddbmm") else shapes[:2]
    return (a[0] if len(a) == 3 else 1), a[-2], b[-1], a[-1]


def padding_flops(calls: Sequence[Call], launches: Iterable[Launch]) -> dict[str, int]:
    """Per precision, the FLOPs a step's GEMM kernels executed beyond the useful ones.

    The step's matmul calls, in the order the dispatch mode saw them, pair one to one
    with the GEMM kernels that matmul ops launched, in launch order (an empty matmul
    launches none and is skipped). Raises :class:`NoCorrection` when they do not pair (the
    counts or an op differ) or a kernel's name states no tile: a partial correction
    would be a wrong one.
    """
    calls = [c for c in calls if min(gemm_dims(c[0], c[1])) > 0]
    gemms = [launch for launch in launches
             if (launch.op or "").removeprefix("aten::") in MATMUL_OPS
             and any(word in launch.kernel.lower() for word in _GEMM_WORDS)]
    if len(gemms) != len(calls):
        raise NoCorrection(f"the step dispatched {len(calls)} matmuls but the profiler saw {len(gemms)} GEMM "
                           "kernels launched by matmul ops, so they cannot be paired")
    padding: Counter[str] = Counter()
    for i, ((op, shapes, precision), launch) in enumerate(zip(calls, gemms)):
        if launch.op != f"aten::{op}":
            raise NoCorrection(f"matmul {i} was {op} but the GEMM kernel launched in its place came from "
                               f"{launch.op}: the launch order does not match")
        batch, m, n, k = gemm_dims(op, shapes)
        executed = executed_flops_of_kernel(m, n, k, launch.kernel, batch)
        if executed is None:
            raise NoCorrection(f"kernel {launch.kernel[:80]} states no tile in its name")
        padding[precision] += executed - 2 * batch * m * n * k
    return dict(padding)


@contextmanager
def cuda_kernels() -> Iterator[KernelTrace]:
    """Run the block under ``torch.profiler`` (CPU ops and CUDA kernels); the trace fills when
    the block ends. A profiler that cannot start or be read leaves it empty with the reason."""
    trace = KernelTrace()
    if torch.autograd._profiler_enabled():
        # Stopping a second profiler would end the job's own profiling session with it.
        trace.problem = "another profiler was running; the hook left it alone"
        yield trace
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    # Catch-alls on purpose: another profiler already running, CUPTI missing or denied --
    # the job must go on, without a correction.
    try:
        profiler = torch.profiler.profile(activities=activities)
        profiler.start()
    except Exception as error:
        trace.problem = f"torch.profiler did not start: {error}"
        yield trace
        return
    try:
        yield trace
    finally:
        try:
            _synchronize()
            profiler.stop()
            trace.launches = launches_of(profiler.events())
        except Exception as error:
            trace.problem = f"torch.profiler failed: {error}"


def executed_flops(useful: dict[str, int], calls: Sequence[Call], trace: KernelTrace) -> dict[str, int]:
    """A profiled step's executed FLOPs per precision: its useful FLOPs plus its GEMMs' tile
    padding (attention and convolution counted as useful: their kernels state no tile)."""
    if trace.problem:
        raise NoCorrection(trace.problem)
    padding = padding_flops(calls, trace.launches)
    return {p: f + padding.get(p, 0) for p, f in useful.items()}


# --- the tracker ------------------------------------------------------------------------------


def post_json(url: str, body: dict[str, Any], token: str | None) -> None:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    urllib.request.urlopen(request, timeout=2).read()


class Tracker:
    """Counts a sample of steps and reports them to the agent every ``report_seconds``.

    ``profile_every``: the first counted step and every ``profile_every``-th counted step
    after it are profiled for the tile correction instead of timed (None or 0: never).
    ``profile`` runs a step under a kernel profiler; the default, :func:`cuda_kernels`,
    is used only where CUDA is available. A report that cannot reach the agent is dropped
    with no exception: the hook must never break the job it watches.
    """

    def __init__(
        self,
        agent_url: str = "http://127.0.0.1:9400",
        every: int = 10,
        report_seconds: float = 30.0,
        reported_mfu: Callable[[], float | None] | None = None,
        token: str | None = None,
        send: Callable[[str, dict[str, Any], str | None], None] = post_json,
        clock: Callable[[], float] = time.perf_counter,
        profile_every: int | None = 100,
        profile: Callable[[], AbstractContextManager[KernelTrace]] | None = None,
    ) -> None:
        if profile_every == 1:
            raise UsageError("profile_every must be at least 2 (a profiled step is not timed), or None for never")
        self.url = agent_url.rstrip("/") + "/api/hook"
        self.every = max(1, every)
        self.report_seconds = report_seconds
        self.reported_mfu = reported_mfu
        self.token = token if token is not None else os.environ.get("KERNELFLEET_TOKEN")
        self.send = send
        self.clock = clock
        self.profile_every = profile_every or None
        self.profile = profile if profile is not None else cuda_kernels if torch.cuda.is_available() else None
        self.steps = 0
        self.counted = 0
        # The last profiled step's useful and executed FLOPs, or why there are none.
        self.correction: tuple[dict[str, int], dict[str, int]] | None = None
        self.correction_note: str | None = (
            None if self.profile is not None and self.profile_every else
            "no CUDA device: no kernels to profile" if self.profile_every else "profiling is off (profile_every)")
        self._pending: dict[str, Any] = self._empty()
        self._last_report = clock()

    def _empty(self) -> dict[str, Any]:
        return {"steps": 0, "seconds": 0.0, "flops": Counter(), "shapes": Counter()}

    @contextmanager
    def step(self) -> Iterator[None]:
        """Wrap one step; every ``every``-th step is counted and timed (or profiled)."""
        self.steps += 1
        if self.steps % self.every:
            yield
            return
        self.counted += 1
        if self.profile is not None and self.profile_every and (self.counted - 1) % self.profile_every == 0:
            with self._profiled(self.profile):
                yield
            return
        counter = FlopCount()
        _synchronize()
        start = self.clock()
        with counter:
            yield
        _synchronize()
        pending = self._pending
        pending["steps"] += 1
        pending["seconds"] += self.clock() - start
        pending["flops"].update(counter.flops)
        pending["shapes"].update(counter.shapes)
        if self.clock() - self._last_report >= self.report_seconds:
            self.flush()

    @contextmanager
    def _profiled(self, profile: Callable[[], AbstractContextManager[KernelTrace]]) -> Iterator[None]:
        counter = FlopCount(ordered=True)
        with profile() as trace:
            with counter:
                yield
            _synchronize()
        useful = dict(counter.flops)
        try:
            self.correction = useful, executed_flops(useful, counter.calls or [], trace)
            self.correction_note = None
        except NoCorrection as reason:
            self.correction, self.correction_note = None, str(reason)

    def flush(self) -> None:
        """Send what was counted since the last report, with the last profiled step's correction."""
        pending, self._pending = self._pending, self._empty()
        self._last_report = self.clock()
        if not pending["steps"]:
            return
        useful, executed = self.correction or (None, None)
        body = {
            "pid": os.getpid(),
            "steps": pending["steps"],
            "seconds": pending["seconds"],
            "useful_flops": dict(pending["flops"]),
            "profiled_useful_flops": useful,
            "executed_flops": executed,
            "correction_note": self.correction_note[:300] if self.correction_note else None,
            "gemms": [{"op": op, "shapes": [list(s) for s in shapes], "dtype": dtype, "count": n}
                      for (op, shapes, dtype), n in pending["shapes"].most_common(32)],
            "reported_mfu": self._reported_mfu(),
        }
        try:
            self.send(self.url, body, self.token)
        except (OSError, http.client.HTTPException):
            pass  # the agent is down, unreachable or dropped the connection: the job goes on

    def _reported_mfu(self) -> float | None:
        """The job's own MFU as a finite float, or None. Trainers keep it as a tensor or NumPy scalar,
        which ``json.dumps`` refuses: the report would raise into the job instead of going out."""
        value = self.reported_mfu() if self.reported_mfu else None
        try:
            value = None if value is None else float(value)
        except (TypeError, ValueError):
            return None
        return value if value is not None and math.isfinite(value) else None


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
