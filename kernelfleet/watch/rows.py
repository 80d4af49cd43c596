"""What `watch` shows of one window, as plain data: the view renders it, ``--json`` prints it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kernelfleet.catalog import TENSOR_PRECISIONS, Catalog
from kernelfleet.ofu import achieved_flops, classify, ofu
from kernelfleet.telemetry.health import clock_event_reasons
from kernelfleet.telemetry.sample import ProcessSample, Sample

# A process -> (job, user): the agent's attribution live, the recording's names on a replay.
Identify = Callable[[ProcessSample], tuple[str | None, str | None]]


def unattributed(process: ProcessSample) -> tuple[str | None, str | None]:
    """No job or user known (the default, and what a recording's PIDs give on another machine)."""
    return None, None


def identify_with(attribute: Callable[[ProcessSample], Any]) -> Identify:
    """An :data:`Identify` from an attribution function that returns a JobIdentity (fleet.attribution)."""
    def identify(process: ProcessSample) -> tuple[str | None, str | None]:
        who = attribute(process)
        return who.job, who.user
    return identify


def rows(batch: Iterable[Sample], catalog: Catalog, identify: Identify = unattributed) -> list[dict[str, Any]]:
    """Everything the view shows, one dict per GPU or MIG instance (also what ``--json`` prints)."""
    out = []
    for sample in batch:
        sku = catalog.lookup(sample.name, sample.pci_device_id)
        reading = ofu(sample, sku)
        flops = {
            p: achieved_flops(reading, sku, p).flops_per_second
            for p in TENSOR_PRECISIONS
            if sku is not None and sku.peak_flops(p) is not None
        }
        reasons = sample.clock_event_reasons_bitmask
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
                "memory_used_bytes": sample.memory_used_bytes,
                "memory_total_bytes": sample.memory_total_bytes,
                "temperature_celsius": sample.temperature_celsius,
                "clock_event_reasons": None if reasons is None else clock_event_reasons(reasons),
                "xid_errors_total": sample.xid_errors_total,
                "xid_last": sample.xid_last,
                "ecc_corrected_errors_total": sample.ecc_corrected_errors_total,
                "ecc_uncorrected_errors_total": sample.ecc_uncorrected_errors_total,
                "pcie_tx_bytes_per_second": sample.pcie_tx_bytes_per_second,
                "pcie_rx_bytes_per_second": sample.pcie_rx_bytes_per_second,
                "nvlink_tx_bytes_per_second": sample.nvlink_tx_bytes_per_second,
                "nvlink_rx_bytes_per_second": sample.nvlink_rx_bytes_per_second,
                "bottleneck": classify(sample).value,
                "stale": sample.stale,
                "error": sample.error,
                "processes": [_process(p, identify) for p in sample.processes],
            }
        )
    return out


def _process(p: ProcessSample, identify: Identify) -> dict[str, Any]:
    job, user = identify(p)
    return {"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes, "job": job, "user": user}
