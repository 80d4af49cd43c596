"""Replicas of a step: one capture per device, and putting each back in its captured state
(runs on GPUs).

A replica is the step captured on one device (its own weights, state and activations at its own
addresses, ``runtime/executor.py``); the executor's graph copies each launch from the replica of
the device that runs it. Each device captures with its own kernels (``profile.devices.KERNELS``);
where any two launch different kernels, every replica places units (``graph/units.py``) instead of
launches. A graph run changes the replicas' state (a decode step advances its cache), so before
every run that is compared with a reference each replica is restored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kernelfleet.graph.units import UnitView, views
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import capture
from kernelfleet.kernels.cuda.replay import saved_state
from kernelfleet.profile.devices import choosing_kernels
from kernelfleet.runtime.executor import Replica

if TYPE_CHECKING:
    from kernelfleet.kernels.ir import Program
    from kernelfleet.kernels.raw import RawCapture
    from kernelfleet.workloads.steps import Step


def capture_replicas(make_step: Callable[[str, int], Step], gpus: dict[str, int], seed: int = 0,
                     kernels: dict[str, str] | None = None) -> tuple[dict[str, Replica], list[Callable[[], None]]]:
    """One capture of the step (``make_step(torch device, seed)``) per named device, on its GPU and
    with its ``kernels`` (by name; default: each library's own choice), and what restores each
    one's captured state. Replicas place units where the captures launch different kernels."""
    replicas, restores = capture_each(make_step, gpus, seed, kernels)
    return aligned(replicas), restores


def capture_each(make_step: Callable[[str, int], Step], gpus: dict[str, int], seed: int = 0,
                 kernels: dict[str, str] | None = None, save: bool = True,
                 pools: dict[str, Any] | None = None) -> tuple[dict[str, Replica], list[Callable[[], None]]]:
    """:func:`capture_replicas` without aligning the replicas (captures made apart are aligned
    together), without saving their state where not ``save`` (several captures over one state
    save it once, together: ``replay.saved_state``), and each device's capture in its graph memory
    pool of ``pools`` where one is given (``capture``'s ``pool``)."""
    replicas, restores = {}, []
    for name, gpu in gpus.items():
        torch.cuda.set_device(gpu)
        step = make_step(f"cuda:{gpu}", seed)
        with choosing_kernels((kernels or {}).get(name, "default")):
            captured = capture(step.fn, step.args, module=step.module, what=step.name, pool=(pools or {}).get(name))
        replicas[name] = Replica(captured, assemble(captured.raw), decode=getattr(step, "decode", None))
        if save:
            restores.append(saved_state(replicas[name].program))
    return replicas, restores


def aligned(replicas: dict[str, Replica]) -> dict[str, Replica]:
    """``replicas`` as they are where every capture launches the same kernels; else each placing the
    units its capture shares with the others (``graph/units.py``), aligned on the first's."""
    found = units_across({d: r.captured.raw for d, r in replicas.items()}, {d: r.program for d, r in replicas.items()})
    if found is None:
        return replicas
    return {d: Replica(r.captured, found[d].program, units=found[d], decode=r.decode) for d, r in replicas.items()}


def units_across(raws: dict[str, RawCapture], programs: dict[str, Program]) -> dict[str, UnitView] | None:
    """Each device's units (``graph/units.py``), aligned on the first device's, where any two of the
    captures ``raws`` (assembled: ``programs``) launch different kernels; None where all launch alike."""
    if len({tuple((n.kind, n.name) for n in raw.nodes) for raw in raws.values()}) <= 1:
        return None
    return views(raws, programs, next(iter(raws)))


def restore_all(restores: list[Callable[[], None]]) -> None:
    """Put every replica back in its captured state, and wait for it."""
    for restore in restores:
        restore()
    torch.cuda.synchronize()


def differing_elements(references: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """Elements of ``outputs`` that differ from their ``references``, bit for bit."""
    return sum(int((a != b).sum()) for a, b in zip(references, outputs))
