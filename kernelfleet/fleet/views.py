"""The dashboard's views at fleet size, from a backend's rows: one row per host, the worst GPUs, an OFU
heatmap and a job's page. Everything the page shows is computed here (and in report.py for a job),
so the page only draws; the documents are what the API serves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from kernelfleet.catalog import Catalog, Price
from kernelfleet.catalog.notes import SAME_DIE, same_die_note
from kernelfleet.errors import KernelfleetError
from kernelfleet.fleet.report import JobGpu, JobReport, Spent

HEATMAP_COLUMNS = 90  # steps of a heatmap at most: a column stays a few pixels wide on a laptop


def gpu_label(host: str, gpu_index: int, mig_instance: int | None) -> str:
    """How a GPU is named on the page: "host / GPU n" (and its MIG instance); the uuid goes in a tooltip."""
    return f"{host} / GPU {gpu_index}" + ("" if mig_instance is None else f" mig {mig_instance}")


class GpuRef(BaseModel):
    uuid: str
    label: str
    ofu_ratio: float | None


class HostRow(BaseModel):
    host: str
    gpus: int  # whole GPUs (MIG instances are rows of their GPU's host, not GPUs)
    gpus_with_ofu: int
    stale: int
    mean_ofu_ratio: float | None  # the mean over the host's whole GPUs that have an OFU
    worst: GpuRef | None  # the whole GPU of least OFU


class Overview(BaseModel):
    """One refresh of the fleet view: every host, the k worst GPUs, the rows of the hosts asked for."""

    hosts: list[HostRow]
    worst: list[GpuRef]
    gpus: list[dict[str, Any]]  # the backend's GPU rows of the hosts asked for, each with its label
    newest_seconds: float | None  # the newest window of any GPU: how live the page is
    ofu_note: str | None  # the H100/H200 reference-clock note, where the fleet holds both


def _ref(g: Mapping[str, Any]) -> GpuRef:
    return GpuRef(uuid=g["uuid"], label=gpu_label(g["host"], g["gpu"], g["mig_instance"]), ofu_ratio=g["ofu_ratio"])


def host_rows(gpus: Sequence[Mapping[str, Any]]) -> list[HostRow]:
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for g in gpus:
        by_host.setdefault(g["host"], []).append(g)
    rows = []
    for host, members in by_host.items():
        whole = [g for g in members if g["mig_instance"] is None]
        measured = [g for g in whole if g["ofu_ratio"] is not None]
        worst = min(measured, key=lambda g: g["ofu_ratio"], default=None)
        rows.append(HostRow(host=host, gpus=len(whole), gpus_with_ofu=len(measured),
                            stale=sum(1 for g in members if g["stale"]),
                            mean_ofu_ratio=sum(g["ofu_ratio"] for g in measured) / len(measured) if measured else None,
                            worst=None if worst is None else _ref(worst)))
    return rows


def worst_gpus(gpus: Iterable[Mapping[str, Any]], k: int) -> list[GpuRef]:
    """The ``k`` whole GPUs of least OFU (a GPU without an OFU is not among them: missing is not low)."""
    measured = [g for g in gpus if g["mig_instance"] is None and g["ofu_ratio"] is not None]
    return [_ref(g) for g in sorted(measured, key=lambda g: (g["ofu_ratio"], g["host"], g["gpu"]))[:k]]


def labelled(gpus: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A backend's GPU rows, each with the name the page shows."""
    return [{**g, "label": gpu_label(g["host"], g["gpu"], g["mig_instance"])} for g in gpus]


def overview(gpus: Sequence[Mapping[str, Any]], hosts: Iterable[str], k: int, catalog: Catalog) -> Overview:
    wanted = set(hosts)
    skus = {g["sku"] for g in gpus}
    return Overview(
        hosts=host_rows(gpus), worst=worst_gpus(gpus, k),
        gpus=labelled(g for g in gpus if g["host"] in wanted),
        newest_seconds=max((g["timestamp_seconds"] for g in gpus), default=None),
        ofu_note=same_die_note(catalog) if set(SAME_DIE) <= skus else None)


# -- heatmap ---------------------------------------------------------------------------------------
class HeatmapRow(BaseModel):
    uuid: str
    label: str
    host: str
    # OFU of each step in thousandths (an integer: a fleet's heatmap is the page's largest answer),
    # None where the GPU had no OFU in the step
    ofu_permille: list[int | None]


class Heatmap(BaseModel):
    start_seconds: int  # where the first column starts
    step_seconds: int
    columns: int
    rows: list[HeatmapRow]  # one per GPU, by host and GPU index


def heatmap_step(start: float, end: float) -> int:
    """Seconds a column stands for: a whole number of minutes (of hours past a day's range) that
    draws [start, end] in at most HEATMAP_COLUMNS columns."""
    minutes = max(1, math.ceil((end - start) / 60 / HEATMAP_COLUMNS))
    return 3600 * math.ceil(minutes / 60) if minutes > 24 else 60 * minutes


def heatmap(grid: Iterable[tuple[str, str, int, int | None, int, float | None]], start: float, end: float,
            step_seconds: int) -> Heatmap:
    """The rows of ``Store.ofu_grid`` (or its Prometheus twin) as one row per GPU and a column per step."""
    first = int(start // step_seconds) * step_seconds
    columns = max(1, math.ceil((end - first) / step_seconds))
    rows: dict[tuple[str, str, int | None], HeatmapRow] = {}
    for host, uuid, gpu, mig, bucket, ofu in grid:
        row = rows.get((host, uuid, mig))
        if row is None:
            row = rows[host, uuid, mig] = HeatmapRow(uuid=uuid, label=gpu_label(host, gpu, mig), host=host,
                                                     ofu_permille=[None] * columns)
        column = (bucket - first) // step_seconds
        if 0 <= column < columns and ofu is not None:
            row.ofu_permille[column] = round(1000 * ofu)
    return Heatmap(start_seconds=first, step_seconds=step_seconds, columns=columns, rows=list(rows.values()))


# -- a job's page ----------------------------------------------------------------------------------
class PriceUsed(BaseModel):
    usd_per_hour: float
    source: str  # where the figure comes from: the catalog's entry, or the page


class JobPage(BaseModel):
    """``kernelfleet job``'s rows (report.py), what the job spent below an OFU, and its timelines."""

    report: JobReport
    spent: Spent
    prices: dict[str, PriceUsed | None]  # by GPU name, as the report names GPUs
    timeline_1m: list[dict[str, float | None]]
    timeline_1h: list[dict[str, float | None]]


def catalog_price(catalog: Catalog, name: str) -> Price | None:
    """The lowest catalog price of a GPU named ``name`` (its NVML name, or a SKU key as Prometheus
    labels carry it); None for a GPU the catalog does not know or does not price."""
    try:
        sku = catalog.get(name) if name in catalog else catalog.lookup(name)
    except KernelfleetError:
        return None
    return min(sku.prices, key=lambda p: p.usd_per_hour, default=None) if sku is not None else None


def prices(catalog: Catalog, gpus: Iterable[JobGpu], usd_per_gpu_hour: float | None,
           set_by: str = "set on the page (usd_per_gpu_hour)") -> dict[str, PriceUsed | None]:
    """The price of each GPU name: ``usd_per_gpu_hour`` where the user set one (``set_by`` says
    how), else the catalog's."""
    out: dict[str, PriceUsed | None] = {}
    for name in {g.name for g in gpus}:
        if usd_per_gpu_hour is not None:
            out[name] = PriceUsed(usd_per_hour=usd_per_gpu_hour, source=set_by)
        elif (price := catalog_price(catalog, name)) is not None:
            out[name] = PriceUsed(usd_per_hour=price.usd_per_hour,
                                  source=f"catalog: {price.provider}, {price.date} ({price.source})")
        else:
            out[name] = None
    return out

