"""The folders a GPU run of the study wrote, read into plain data: ``bench ofu-report``'s inputs.

A missing or unreadable file is a UsageError that names it and the command that writes it.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelfleet.catalog import Catalog, Sku
from kernelfleet.documents import read_text
from kernelfleet.errors import UsageError
from kernelfleet.telemetry.ncu import NcuKernel, parse_ncu_csv
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.telemetry.sample import Sample


@dataclass(frozen=True, slots=True)
class Sweep:
    """``kernelfleet bench ofu --out DIR``: the sweep's points and the counter windows sampled beside them."""

    points: list[dict[str, Any]]
    samples: list[Sample]


@dataclass(frozen=True, slots=True)
class NcuRun:
    """One ``bench/ncu_sweep.sh`` run: ncu's CSV text and the sweep points in the order it launched them."""

    csv_text: str
    order: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ClockRun:
    """``bench/ofu_clock_check.py``'s folder: its loops, counter windows and 1-ms NVML clock reads, and,
    where its ncu half ran, the launches, the kernels ncu profiled and the NVML reads beside them."""

    loops: list[dict[str, Any]]
    samples: list[Sample]
    reads: list[list[Any]]
    launches: list[dict[str, Any]]
    kernels: list[NcuKernel]
    ncu_reads: list[list[Any]]


def read_jsonl(path: Path) -> list[Any]:
    """The JSON value on every non-blank line of a file (gunzipped when its name ends in ``.gz``)."""
    return [json.loads(line) for line in read_text(path).splitlines() if line.strip()]


def read_sweep(folder: Path) -> Sweep:
    """The sweep ``kernelfleet bench ofu --out folder`` wrote."""
    points_file = folder / "sweep-points.jsonl.gz"
    if not points_file.exists():
        raise UsageError(f"{points_file}: no such file (write one with `kernelfleet bench ofu --out {folder}`)")
    try:
        with gzip.open(points_file, "rt") as f:
            points = [json.loads(line) for line in f]
    except (OSError, ValueError) as exc:
        raise UsageError(f"{points_file}: corrupt or truncated ({exc})") from exc
    samples = [b[0] for b in ReplaySource(folder / "sweep-trace.jsonl.gz").batches()]
    if not samples:
        raise UsageError(f"{folder}: the counter trace has no windows")
    return Sweep(points, samples)


def recorded_sku(samples: list[Sample], catalog: Catalog, what: str) -> Sku:
    """The catalog's SKU of the GPU that recorded ``samples``; ``what`` names what its peak measures."""
    sku = catalog.lookup(samples[0].name, samples[0].pci_device_id)
    if sku is None:
        raise UsageError(f"{samples[0].name} is not in the catalog: no peak to measure {what} against")
    return sku


def _csv_file(folder: Path, stem: str) -> Path | None:
    return next((f for f in (folder / f"{stem}.csv.gz", folder / f"{stem}.csv") if f.exists()), None)


def read_ncu_runs(folder: Path) -> list[NcuRun]:
    """Each ncu run in the folder: ncu-sweep, then ncu-rerun if present."""
    runs = []
    for stem in ("ncu-sweep", "ncu-rerun"):
        csv_file, order_file = _csv_file(folder, stem), folder / f"{stem}-points.jsonl"
        if csv_file is None or not order_file.exists():
            continue
        try:
            runs.append(NcuRun(read_text(csv_file), read_jsonl(order_file)))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{folder}: unreadable ncu output {csv_file.name} ({exc})") from exc
    if not runs:
        raise UsageError(f"{folder}: expected ncu-sweep.csv[.gz] and ncu-sweep-points.jsonl (bash bench/ncu_sweep.sh)")
    return runs


def read_clock_run(folder: Path) -> ClockRun:
    """The files ``bench/ofu_clock_check.py loop`` (and, if it ran, ``... ncu``) wrote to the folder."""
    need = [folder / name for name in ("clock-loop.jsonl.gz", "clock-trace.jsonl.gz", "nvml-clock-loop.jsonl.gz")]
    if not all(f.exists() for f in need):
        names = ", ".join(f.name for f in need)
        raise UsageError(f"{folder}: expected {names} (python3 bench/ofu_clock_check.py loop)")
    try:
        lines, reads = read_jsonl(need[0]), read_jsonl(need[2])
        samples = [b[0] for b in ReplaySource(need[1]).batches()]
        launches_file = folder / "ncu-clock-launches.jsonl"
        csv_file = _csv_file(folder, "ncu-clock")
        launches = read_jsonl(launches_file) if launches_file.exists() else []
        csv_text = read_text(csv_file) if launches and csv_file is not None else ""
        kernels = parse_ncu_csv(csv_text) if csv_text else []
        ncu_reads = read_jsonl(folder / "nvml-clock-ncu.jsonl.gz") if launches else []
    except (OSError, ValueError, EOFError) as exc:  # EOFError: a .gz cut short by a killed writer
        raise UsageError(f"{folder}: unreadable clock-check output ({exc})") from exc
    if not samples:
        raise UsageError(f"{need[1]}: the counter trace has no windows")
    return ClockRun(lines, samples, reads, launches, kernels, ncu_reads)
