"""The live view: one row per GPU, OFU first. A client of telemetry/ and ofu/."""

from __future__ import annotations

from typing import Any, Iterable

from rich.table import Table

from kernelfleet.catalog import TENSOR_PRECISIONS, Catalog
from kernelfleet.ofu import achieved_flops, classify, ofu
from kernelfleet.telemetry.sample import Sample


def rows(batch: Iterable[Sample], catalog: Catalog) -> list[dict[str, Any]]:
    """Everything the view shows, as plain data (also what ``--json`` prints)."""
    out = []
    for sample in batch:
        sku = catalog.lookup(sample.name, sample.pci_device_id)
        reading = ofu(sample, sku)
        flops = {
            p: achieved_flops(reading, sku, p).flops_per_second
            for p in TENSOR_PRECISIONS
            if sku is not None and sku.peak_flops(p) is not None
        }
        out.append(
            {
                "gpu": sample.gpu_index,
                "mig_instance": sample.mig_instance,
                "uuid": sample.uuid,
                "name": sample.name,
                "sku": sku.key if sku else None,
                "timestamp_seconds": sample.timestamp_seconds,
                "window_seconds": sample.window_seconds,
                "ofu_ratio": reading.ofu_ratio,
                "ofu_unavailable_reason": reading.reason,
                "tensor_active_ratio": sample.tensor_active_ratio,
                "sm_clock_mean_hertz": sample.sm_clock_mean_hertz,
                "sm_clock_polls": sample.sm_clock_polls,
                "reference_clock_hertz": reading.reference_clock_hertz,
                "reference_clock_source": reading.reference_clock_source,
                "achieved_flops_if_precision": flops,
                "sm_active_ratio": sample.sm_active_ratio,
                "sm_occupancy_ratio": sample.sm_occupancy_ratio,
                "dram_bandwidth_ratio": sample.dram_bandwidth_ratio,
                "power_mean_watts": sample.power_mean_watts,
                "bottleneck": classify(sample).value,
                "stale": sample.stale,
                "error": sample.error,
                "processes": [
                    {"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes} for p in sample.processes
                ],
            }
        )
    return out


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:5.1f}%"


def table(view_rows: list[dict[str, Any]], title: str) -> Table:
    """A rich table of ``rows`` output."""
    t = Table(title=title, title_justify="left", expand=False)
    for header, justify in [
        ("GPU", "right"), ("model", "left"), ("OFU", "right"), ("tensor", "right"),
        ("SM clock", "right"), ("bf16 TFLOP/s", "right"), ("SM act", "right"), ("DRAM bw", "right"),
        ("power", "right"), ("bottleneck", "left"), ("processes", "left"),
    ]:
        t.add_column(header, justify=justify)  # type: ignore[arg-type]
    for r in view_rows:
        gpu = str(r["gpu"]) if r["mig_instance"] is None else f"{r['gpu']}/mig{r['mig_instance']}"
        if r["stale"]:
            t.add_row(gpu, r["name"].removeprefix("NVIDIA "), "[red]stale[/]", "", "", "", "", "", "", "", r["error"] or "")
            continue
        ofu_text = _pct(r["ofu_ratio"]) if r["ofu_ratio"] is not None else "[dim]n/a[/]"
        clock = r["sm_clock_mean_hertz"]
        bf16 = r["achieved_flops_if_precision"].get("bf16")
        procs = ", ".join(f"{p['pid']} {p['name'] or ''}".strip() for p in r["processes"][:3])
        if len(r["processes"]) > 3:
            procs += f" +{len(r['processes']) - 3}"
        t.add_row(
            gpu,
            r["name"].removeprefix("NVIDIA "),
            f"[bold]{ofu_text}[/]",
            _pct(r["tensor_active_ratio"]),
            "—" if clock is None else f"{clock / 1e6:.0f} MHz",
            "—" if bf16 is None else f"{bf16 / 1e12:.0f}",
            _pct(r["sm_active_ratio"]),
            _pct(r["dram_bandwidth_ratio"]),
            "—" if r["power_mean_watts"] is None else f"{r['power_mean_watts']:.0f} W",
            r["bottleneck"],
            procs,
        )
    return t
