"""A job's report as rows: what ``kernelfleet job NAME`` shows, from the store's job report.

:func:`job_report` turns ``Store.job_report``'s document (also what ``--json`` prints and the API
serves) into typed rows; :func:`render` turns the rows into what a terminal shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import RenderableType
from rich.table import Table

# The OFU per minute as a bar of eight levels, full at 80 % OFU.
BARS = " ▁▂▃▄▅▆▇█"
FULL_BAR_OFU = 0.8


@dataclass(frozen=True, slots=True)
class JobGpu:
    """One GPU (or MIG instance) the job held, over the job's lifetime."""

    host: str
    gpu_index: int
    uuid: str
    mig_instance: int | None
    name: str
    ofu_ratio: float | None  # None: no window of it had an OFU
    seconds: float
    mean_share: float  # the job's mean share of the GPU
    approximate: bool  # time-shared with other jobs: split by SM utilisation


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A regression (or other event) the detector raised for the job."""

    ts: float
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class JobReport:
    """A job's rows: its GPUs, where its time went, its OFU per minute and its events."""

    job: str
    kind: str
    user: str | None
    first_seen: float
    last_seen: float
    gpus: list[JobGpu]
    bottleneck_shares: dict[str, float]  # class -> share of the job's GPU-seconds, largest first
    minute_levels: list[int]  # OFU of each minute as a bar level, 0 to 8 (8: FULL_BAR_OFU or more)
    events: list[JobEvent]


def job_report(report: Mapping[str, Any]) -> JobReport:
    """The rows of ``Store.job_report(job)``."""
    seconds = report["bottleneck_seconds"]
    total = sum(seconds.values()) or 1.0
    return JobReport(
        report["job"], report["kind"], report["user"], report["first_seen"], report["last_seen"],
        [JobGpu(g["host"], g["gpu_index"], g["uuid"], g["mig_instance"], g["name"], g["ofu_ratio"], g["seconds"],
                g["mean_share"], g["approximate"])
         for g in report["gpus"]],
        {k: v / total for k, v in seconds.items()},
        [min(8, int((p["ofu_ratio"] or 0) * 8 / FULL_BAR_OFU)) for p in report["timeline_1m"]],
        [JobEvent(e["ts"], e["kind"], e["detail"]) for e in report["events"]],
    )


@dataclass(frozen=True, slots=True)
class SpentGpu:
    """What one of the job's GPUs spent in minutes below the threshold."""

    host: str
    gpu_index: int
    uuid: str
    mig_instance: int | None
    gpu_hours: float  # the job's share of the GPU's time in those minutes
    usd_per_hour: float | None  # None: no price for this GPU
    usd: float | None


@dataclass(frozen=True, slots=True)
class Spent:
    """GPU-hours and dollars a job spent in minutes whose OFU was below ``below_ofu_ratio``."""

    below_ofu_ratio: float
    gpus: list[SpentGpu]
    gpu_hours: float
    usd: float  # of the priced GPUs only
    unpriced_gpu_hours: float  # hours of GPUs without a price: in gpu_hours, not in usd


def spent_below(r: JobReport, below_ofu_ratio: float, seconds_below: Mapping[tuple[str, int | None], float],
                usd_per_hour: Callable[[JobGpu], float | None]) -> Spent:
    """The job's GPU-hours below the threshold (``seconds_below`` per (uuid, MIG instance), as
    ``Store.job_seconds_below`` gives them) priced at each GPU's ``usd_per_hour``."""
    rows = []
    for g in r.gpus:
        hours = seconds_below.get((g.uuid, g.mig_instance), 0.0) / 3600
        price = usd_per_hour(g)
        rows.append(SpentGpu(g.host, g.gpu_index, g.uuid, g.mig_instance, hours, price,
                             None if price is None else hours * price))
    return Spent(below_ofu_ratio, rows, sum(g.gpu_hours for g in rows), sum(g.usd for g in rows if g.usd is not None),
                 sum(g.gpu_hours for g in rows if g.usd is None))


def spent_lines(spent: Spent, prices: Mapping[str, Any]) -> list[str]:
    """What ``kernelfleet job`` prints of :func:`spent_below`: the total, then each GPU name's price
    and where it comes from (``prices``: name -> ``views.PriceUsed`` or None)."""
    head = (f"below {100 * spent.below_ofu_ratio:.0f}% OFU: {spent.gpu_hours:.2f} GPU-hours, "
            f"${spent.usd:,.2f}")
    if spent.unpriced_gpu_hours:
        head += f" ({spent.unpriced_gpu_hours:.2f} GPU-hours have no price)"
    return [head] + [f"  {name}: " + (f"${p.usd_per_hour:.2f}/GPU-hour, {p.source}" if p else "no price")
                     for name, p in sorted(prices.items())]


def render(r: JobReport) -> list[RenderableType]:
    """The report as a terminal shows it: a header line, the GPU table, bottlenecks, the OFU bar, events."""
    header = (f"[bold]{r.job}[/] ({r.kind}, user {r.user or '?'}) "
              f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.first_seen))} → "
              f"{time.strftime('%H:%M:%S', time.localtime(r.last_seen))}")
    t = Table("host", "GPU", "model", "OFU", "seconds", "share", "note")
    for g in r.gpus:
        ofu = "—" if g.ofu_ratio is None else f"{100 * g.ofu_ratio:.1f}%"
        t.add_row(g.host, str(g.gpu_index), g.name, ofu, f"{g.seconds:.0f}", f"{g.mean_share:.2f}",
                  "shared: approximate" if g.approximate else "")
    return [
        header, t,
        "bottlenecks: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in r.bottleneck_shares.items()),
        "OFU per minute: " + "".join(BARS[level] for level in r.minute_levels),
        *(f"[red]{e.kind}[/] {time.strftime('%H:%M:%S', time.localtime(e.ts))}: {e.detail}" for e in r.events),
    ]
