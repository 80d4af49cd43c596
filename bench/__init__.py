"""Benchmarks, fixture recorders and plot scripts, each run from the repository root as a module.

    python -m bench.NAME [--help]

Benchmarks print a table and the command that made it (``agent_perf``, ``sampler_cost``, ``place_pairs``,
``nvml_calls``, ``plan_solver``, ``plan_scaling_captured``, ``plan_measured``, ``executor_check``;
``place_table`` reads what ``place_pairs`` wrote).
Recorders re-make what ``tests/data`` holds: ``make record`` on a GPU machine runs them (the shell
wrappers here), ``make record-demo`` the one that runs on a CPU. ``make docs`` runs the ``plot_*``
scripts on the committed recordings. ``loops`` holds the GPU loops the recorders time.
Importing any of them does no work (tests/unit/test_bench_scripts.py checks it, and ``--help``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any, NoReturn

from kernelfleet.errors import UsageError


def command_line() -> str:
    """How this run was started, as one types it: ``python -m bench.NAME ARGS`` (STYLE rule 12)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = ["-m", spec.name] if spec is not None else sys.argv[:1]
    return shlex.join([sys.executable, *head, *sys.argv[1:]])


class Parser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line (bad input is one line, STYLE): ``python -m
    bench.NAME: error: ... (python -m bench.NAME --help says what it takes)``, exit status 2, the
    script named as it is run rather than as its file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is not None and spec.name.startswith("bench."):
            kwargs.setdefault("prog", f"python -m {spec.name}")
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} ({self.prog} --help says what it takes)\n")


def gpu_folder(out: Path, why: str) -> None:
    """UsageError unless this machine has a CUDA GPU (``why`` it must) and ``out`` is a folder now."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"no CUDA GPU here: {why}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{out}: cannot make the folder ({exc.strerror})") from exc
