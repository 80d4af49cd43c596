"""Calibrate device profiles and time a captured step on them (runs on a GPU).

``kernelfleet calibrate`` and ``kernelfleet profile`` are thin clients of this module, and so is
``bench/capture_run.py``. Partitions are disjoint (``driver.green_streams``); on an H200 they add
up to at most 120 of its 132 SMs (the driver splits it into 15 groups of 8).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from kernelfleet.costs.links import MeasuredLink
from kernelfleet.errors import UsageError
from kernelfleet.profile.calibration import CalibrationRow, PairChoice, pick_pair, targets
from kernelfleet.profile.devices import DeviceProfile, ProfileSpec
from kernelfleet.profile.table import StepTimes

# Candidate (work SMs, hog SMs) profiles; None: the whole GPU / no hog.
SWEEP = ((None, None), (56, 64), (48, 72), (56, 48), (48, 64), (40, 80), (64, 56), (32, 88),
         (32, None), (40, None), (48, None), (56, None))
REAL_PAIR = ("l40s", "a100-sxm-80gb")  # compute-rich, bandwidth-rich: Tessera's A100 + L40S


def parse_profile(text: str, device: int = 0) -> ProfileSpec:
    """``NAME``, ``NAME:SMS`` or ``NAME:SMS+HOG`` (e.g. ``compute:56+64``, ``whole``), with an
    optional ``@GPU`` index (``bandwidth:32@1``) in place of ``device`` and an optional
    ``/KERNELS`` (``b:32@0/math-attention``: ``devices.KERNELS``)."""
    given = text
    text, slash, kernels = text.partition("/")
    if slash and not kernels:
        raise UsageError(f"profile {given!r}: nothing after '/': name the kernels (e.g. /math-attention)")
    spec, at, gpu = text.partition("@")
    name, _, shape = spec.partition(":")
    work, _, hog = shape.partition("+")
    if not name or not all(part.isdigit() for part in (work, hog) if part) or (at and not gpu.isdigit()):
        raise UsageError(f"profile {text!r}: expected NAME[:SMS[+HOG]][@GPU] with whole numbers, e.g. compute:56+64@0")
    return ProfileSpec(name, int(work) if work else None, int(hog) if hog else None, int(gpu) if at else device,
                       kernels or "default")


def calibrate_profiles(specs: list[ProfileSpec], progress: Callable[[dict], None] | None = None) -> list[CalibrationRow]:
    """GEMM / GEMV / copy rates of each profile, with the SMs it got and the hog's own rate
    (the rows of a :class:`Calibration`)."""
    from kernelfleet.profile.timing import calibrate

    rows = []
    for spec in specs:
        with DeviceProfile(spec) as device, device.active() as stream:
            rates = calibrate(stream, spec.device)
        row = {"name": spec.name, "sms": spec.sms, "granted_sms": device.sms, "hog_sms": spec.hog_sms, **rates,
               "hog_bytes_per_second": device.hog_bytes_per_second}
        rows.append(row)
        if progress:
            progress(row)
    return rows


def sweep_specs(device: int = 0) -> list[ProfileSpec]:
    return [ProfileSpec(f"{sms or 'all'}+{hog or 0}", sms, hog, device) for sms, hog in SWEEP]


def choose(rows: list[CalibrationRow], real_pair: tuple[str, str] = REAL_PAIR) -> PairChoice:
    return pick_pair(rows, *targets(*real_pair))


def pair_specs(choice: PairChoice, device: int = 0) -> tuple[ProfileSpec, ProfileSpec]:
    return (ProfileSpec("compute", choice.compute["sms"], choice.compute["hog_sms"], device),
            ProfileSpec("bandwidth", choice.bandwidth["sms"], None, device))


def time_on(captured: Any, specs: list[ProfileSpec], progress: Callable[[int], None] | None = None,
            trials: int = 5, flush_l2_bytes: int = 0) -> dict[str, list[float]]:
    """Seconds of every launch of a captured step on each profile: ``{profile: [seconds]}``."""
    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.cuda.replay import replay_preludes
    from kernelfleet.profile.timing import time_launches

    resets = replay_preludes(assemble(captured.raw))
    out = {}
    for spec in specs:
        with DeviceProfile(spec) as device, device.active() as stream:
            out[spec.name] = time_launches(captured, stream, resets=resets, context=device.context, trials=trials,
                                           flush_l2_bytes=flush_l2_bytes, progress=progress)
    return out


def step_times(chains: dict[str, list[Any]], specs: list[ProfileSpec], *, together: list[str] | None = None,
               trials: int = 10, measure_link: bool = False) -> StepTimes:
    """The step as one graph on each profile of ``specs``, ``chains[name]`` its chains (captures of
    the step, replicas of their own where there is more than one): alone on each, free on each
    with two chains or more (one chain has no other to run beside), and
    shared among the profiles named in ``together`` (default: all of them) when they are two or
    more (exactly two: their graphs launched together once too, ``steptime.together_seconds``), and
    with ``measure_link`` the link between every two of them (:func:`link_times`; off by
    default: the planners then price copies with it, and on the H200 pair that chose worse, docs/place.md). Partitions of one GPU that overlap (the whole GPU and a part of it) cannot run at once:
    leave the whole GPU out of ``together``; profiles timed together need captures of their own
    (UsageError otherwise)."""
    from kernelfleet.profile.steptime import graph_seconds, shared_seconds, together_seconds

    names = [spec.name for spec in specs] if together is None else together
    owner: dict[int, str] = {}
    for name in names:  # run at once, two devices' graphs over one capture would write its buffers together
        for captured in chains[name]:
            if owner.setdefault(id(captured), name) != name:
                raise UsageError(f"profiles {owner[id(captured)]} and {name} are timed together over the same capture: "
                                 "give each a capture of its own")
    alone, free = {}, {}
    for spec in specs:
        with DeviceProfile(spec) as device, device.active() as stream:
            alone[spec.name] = graph_seconds(chains[spec.name], stream, device.context, trials=trials)
            if len(chains[spec.name]) > 1:
                free[spec.name] = graph_seconds(chains[spec.name], stream, device.context, trials=trials, free=True)
    shared: dict[str, float] = {}
    links: list[MeasuredLink] = []
    at_once = None  # the pair's graphs launched together once
    if len(names) > 1:
        with ExitStack() as stack:
            running = {}
            for spec in (s for s in specs if s.name in names):
                device = stack.enter_context(DeviceProfile(spec))
                running[spec.name] = (chains[spec.name], stack.enter_context(device.active()), device.context)
            shared = shared_seconds(running, alone, trials=trials)
            if len(running) == 2:
                at_once = together_seconds(running, trials=trials)
        if measure_link:
            links = link_times([s for s in specs if s.name in names])
    return StepTimes(alone, free, shared, links, at_once)


def link_times(specs: list[ProfileSpec], *, trials: int = 20) -> list[MeasuredLink]:
    """The link between every two profiles of ``specs`` (``profile/linkcost.py``), measured with all
    of them open, so their partitions are the disjoint ones they run on together."""
    import torch

    from kernelfleet.profile.linkcost import SIZES_BYTES, End, LinkGraphs, graph_timer

    if len(specs) < 2:
        return []
    with ExitStack() as stack:
        kernels: dict[int, tuple[Any, Any]] = {}  # GPU -> (its small kernel's capture, the kernel node)
        ends, buffers = {}, []
        for spec in specs:
            device = stack.enter_context(DeviceProfile(spec))
            if spec.device not in kernels:
                kernels[spec.device] = _small_kernel(spec.device)
            captured, node = kernels[spec.device]
            buffers.append(torch.empty(max(SIZES_BYTES), dtype=torch.uint8, device=f"cuda:{spec.device}"))
            ends[spec.name] = End(spec.name, device.context or captured.context, captured.context, node,
                                  buffers[-1].data_ptr())
        timer = graph_timer(torch.cuda.Stream(device=specs[0].device), trials)
        return [LinkGraphs(ends[a.name], ends[b.name], timer).measure() for i, a in enumerate(specs)
                for b in specs[i + 1:]]


def _small_kernel(gpu: int) -> tuple[Any, Any]:
    """A captured elementwise add of 64 K floats on ``gpu`` (a few µs) and its kernel node: what the
    link measurement puts between its copies (the capture keeps the tensors it reads alive)."""
    import torch

    from kernelfleet.kernels.cuda.capture import capture

    torch.cuda.set_device(gpu)
    x = torch.zeros(1 << 16, device=f"cuda:{gpu}")
    captured = capture(lambda x, y: torch.add(x, 1, out=y), (x, torch.empty_like(x)), what="link measurement kernel",
                       record_ops=False)
    return captured, next(captured.nodes[i] for i, n in enumerate(captured.raw.nodes) if n.kind == "kernel")
