"""GPM metrics between two GPM samples: the counters OFU and the bottleneck classes rest on.

:class:`GpmMetrics` asks NVML for the metrics of :data:`GPM_METRICS` between two samples (and,
while the driver answers them, the cycle counters of :data:`CYCLE_METRICS` in the same call),
through one request structure per metric set made once, since it is too big to make and zero
every window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import KernelfleetError
from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.nvml_hot import plain_layout

MIB = 1024 * 1024

# GPM metric id -> (Sample field, scale). Ids are NVML_GPM_METRIC_* from nvml.h;
# utilisations come in percent, link rates in MiB/s.
GPM_METRICS: dict[int, tuple[str, float]] = {
    5: ("tensor_active_ratio", 0.01),  # ANY_TENSOR_UTIL
    7: ("hmma_active_ratio", 0.01),  # HMMA_TENSOR_UTIL (fp16/bf16/tf32/fp8)
    9: ("imma_active_ratio", 0.01),  # IMMA_TENSOR_UTIL (int8)
    6: ("dfma_active_ratio", 0.01),  # DFMA_TENSOR_UTIL (fp64)
    2: ("sm_active_ratio", 0.01),  # SM_UTIL
    3: ("sm_occupancy_ratio", 0.01),  # SM_OCCUPANCY
    10: ("dram_bandwidth_ratio", 0.01),  # DRAM_BW_UTIL
    13: ("fp16_active_ratio", 0.01),
    12: ("fp32_active_ratio", 0.01),
    11: ("fp64_active_ratio", 0.01),
    4: ("integer_active_ratio", 0.01),
    20: ("pcie_tx_bytes_per_second", MIB),
    21: ("pcie_rx_bytes_per_second", MIB),
    61: ("nvlink_tx_bytes_per_second", MIB),
    60: ("nvlink_rx_bytes_per_second", MIB),
}


# Cycle counters that newer NVML headers list for GPM (SM_CYCLES_ELAPSED = 248,
# MMA_CYCLES_ACTIVE = 250, "since reboot"). Their difference over a window would give the
# mean SM clock exactly, with no polling, and the tensor-busy cycles behind OFU. Not yet
# seen answering on our H200 (driver 580): recorded raw, as NVML reports them, until a
# GPU run settles what they mean (docs/telemetry.md, "Cycle counters instead of clock polling").
CYCLE_METRICS: dict[int, tuple[str, float]] = {
    248: ("sm_cycles_elapsed_raw", 1.0),
    250: ("mma_cycles_active_raw", 1.0),
}
WITH_CYCLES = GPM_METRICS | CYCLE_METRICS  # asked in one call while the driver answers the counters


@dataclass
class GpmMetrics:
    """Reads GPM metrics for a source (``warn_once(key, message)``: its once-only log)."""

    nvml: Nvml
    warn_once: Callable[[str, str], None]
    cycle_counters: bool = True  # off once the driver refuses them
    # the request's layout from pynvml's type; the benchmark passes pynvml's own (``lambda t: t``)
    # to time what the plain one saves
    layout: Callable[[type], type] = plain_layout
    requests: dict[int, tuple[Any, list[Any]]] = field(default_factory=dict)  # id(metric set) -> request, slots

    def metrics(self, first: Any, second: Any) -> dict[str, float | None]:
        """The metrics of the window between GPM samples ``first`` and ``second``; a metric the
        driver does not answer is None (and logged once)."""
        if not self.cycle_counters:
            return self._get(first, second, GPM_METRICS)
        # The cycle counters ride in the same call (one nvmlGpmMetricsGet a window, ~130 µs of CPU
        # after a sleep on an H200). A driver that refuses the whole call for them is asked again
        # without them, so they cannot cost the metrics; one that refuses the call, or answers every
        # counter with an error (the H200's, driver 580: code 2), is not asked for them again.
        try:
            values = self._get(first, second, WITH_CYCLES)
        except KernelfleetError as exc:
            values = self._get(first, second, GPM_METRICS)  # raises where the GPU itself failed
            values.update(dict.fromkeys(name for name, _ in CYCLE_METRICS.values()))
            why: str | None = str(exc)
        else:
            why = "every counter refused" if all(values[name] is None for name, _ in CYCLE_METRICS.values()) else None
        if why is not None:
            self.cycle_counters = False
            self.warn_once("gpm-cycles", f"GPM cycle counters unavailable ({why}); not asked for again")
        return values

    def _get(self, first: Any, second: Any, wanted: dict[int, tuple[str, float]]) -> dict[str, float | None]:
        m = self.nvml.m
        # One request per metric set, reused, with a view of each slot asked for: the structure
        # holds room for every GPM metric (~10 KB), too much to allocate and zero every window for
        # the 15 asked, and each index into its array would make a new view object. It is pynvml's
        # layout without pynvml's Python hook on every field (telemetry/nvml_hot.py: plain_layout).
        cached = self.requests.get(id(wanted))
        if cached is None:
            request = self.layout(m.c_nvmlGpmMetricsGet_t)()
            cached = self.requests[id(wanted)] = request, [request.metrics[slot] for slot in range(len(wanted))]
        request, slots = cached
        request.version = m.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = first
        request.sample2 = second
        for metric, metric_id in zip(slots, wanted):
            metric.metricId = metric_id
        self.nvml.call("nvmlGpmMetricsGet", request)
        values: dict[str, float | None] = {}
        success = m.NVML_SUCCESS
        for metric, (metric_id, (name, scale)) in zip(slots, wanted.items()):
            code = metric.nvmlReturn
            if code != success:
                self.warn_once(f"gpm-{metric_id}", f"GPM metric {name} unavailable (NVML code {code})")
                values[name] = None
            else:
                values[name] = metric.value * scale
        return values
