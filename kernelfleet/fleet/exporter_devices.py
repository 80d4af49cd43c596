"""The device families of /metrics: what operators already chart beside OFU (memory, temperature,
clock-event reasons, Xid and ECC counts, PCIe and NVLink rates), as dcgm-exporter and nvidia-smi
show them, in base units.

Cardinality stays at the GPU's own label set: one series per GPU per family, plus a fixed set of
nine clock-event reasons and two ECC types. Per-process memory is the one family keyed by process;
it is off unless asked for, and then bounded to the ``process_series_per_gpu`` processes holding the
most memory on each GPU, so a node that spawns thousands of short processes cannot flood Prometheus.
A value a GPU lacks (an older recording, ECC off, a MIG slice's whole-GPU values) is absent, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from kernelfleet.errors import UsageError
from kernelfleet.fleet.reading import Reading
from kernelfleet.telemetry.health import CLOCK_EVENT_REASONS
from kernelfleet.telemetry.sample import Sample

# The most per-process series one GPU may export when they are asked for.
PROCESS_SERIES_MAX = 64

# metric name, help, how to read it from a Sample
GAUGES: tuple[tuple[str, str, Callable[[Sample], float | None]], ...] = (
    ("kernelfleet_memory_used_bytes", "GPU memory in use (framebuffer).", lambda s: s.memory_used_bytes),
    ("kernelfleet_memory_total_bytes", "GPU memory in all.", lambda s: s.memory_total_bytes),
    ("kernelfleet_temperature_celsius", "GPU die temperature.", lambda s: s.temperature_celsius),
    ("kernelfleet_pcie_transmit_bytes_per_second", "PCIe bytes sent per second over the window (GPM).",
     lambda s: s.pcie_tx_bytes_per_second),
    ("kernelfleet_pcie_receive_bytes_per_second", "PCIe bytes received per second over the window (GPM).",
     lambda s: s.pcie_rx_bytes_per_second),
    ("kernelfleet_nvlink_transmit_bytes_per_second", "NVLink bytes sent per second over the window (GPM).",
     lambda s: s.nvlink_tx_bytes_per_second),
    ("kernelfleet_nvlink_receive_bytes_per_second", "NVLink bytes received per second over the window (GPM).",
     lambda s: s.nvlink_rx_bytes_per_second),
    ("kernelfleet_processes", "Compute processes holding the GPU.", lambda s: float(len(s.processes))),
    ("kernelfleet_xid_last_code", "The code of the latest Xid error seen (absent until one is).", lambda s: s.xid_last),
)


def check_process_series(count: int) -> int:
    """``count`` if it is a per-GPU bound this exporter accepts; a one-line error otherwise."""
    if not 0 <= count <= PROCESS_SERIES_MAX:
        raise UsageError(f"--process-series must be 0..{PROCESS_SERIES_MAX} per GPU, got {count}")
    return count


def device_families(readings: Sequence[Reading], label_names: Sequence[str],
                    labels_of: Callable[[Reading], list[str]], process_series_per_gpu: int = 0) -> list[Metric]:
    """The device families for ``readings``; a stale window exports none of them."""
    gauges = {name: GaugeMetricFamily(name, text, labels=label_names) for name, text, _ in GAUGES}
    reasons = GaugeMetricFamily("kernelfleet_clock_event_reason_active",
                                "1 while NVML reports this reason holding the clocks down (throttle reasons).",
                                labels=[*label_names, "reason"])
    xid = CounterMetricFamily("kernelfleet_xid_errors", "Xid errors (NVML events) since the agent started.",
                              labels=label_names)
    ecc = CounterMetricFamily("kernelfleet_ecc_errors", "ECC errors since the driver loaded (volatile).",
                              labels=[*label_names, "type"])
    processes = GaugeMetricFamily("kernelfleet_process_memory_used_bytes",
                                  "GPU memory of one process (opt-in, the largest per GPU only).",
                                  labels=[*label_names, "pid", "process"])
    for r in readings:
        s = r.sample
        if s.stale:
            continue
        labels = labels_of(r)
        for name, _, read in GAUGES:
            value = read(s)
            if value is not None and math.isfinite(value):
                gauges[name].add_metric(labels, float(value))
        if s.clock_event_reasons_bitmask is not None:
            for bit, reason in CLOCK_EVENT_REASONS.items():
                reasons.add_metric([*labels, reason], 1.0 if s.clock_event_reasons_bitmask & bit else 0.0)
        if s.xid_errors_total is not None:
            xid.add_metric(labels, float(s.xid_errors_total))
        for kind, count in (("corrected", s.ecc_corrected_errors_total), ("uncorrected", s.ecc_uncorrected_errors_total)):
            if count is not None:
                ecc.add_metric([*labels, kind], float(count))
        biggest = sorted((p for p in s.processes if p.used_memory_bytes is not None),
                         key=lambda p: (-p.used_memory_bytes, p.pid))[:process_series_per_gpu]
        for p in biggest:
            processes.add_metric([*labels, str(p.pid), p.name or ""], float(p.used_memory_bytes))
    families: list[Metric] = [*gauges.values(), reasons, xid, ecc]
    return families + [processes] if process_series_per_gpu else families
