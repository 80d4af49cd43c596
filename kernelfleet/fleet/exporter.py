"""Prometheus exposition of the agent's latest readings, as a custom collector.

Names follow Prometheus conventions (base units, ``_ratio`` for 0-1 values).
Series carry only ``gpu``, ``uuid``, ``model`` and ``hostname`` (plus ``mig``
for MIG slices, and ``namespace``, ``pod``, ``container`` for the one Kubernetes
container holding the GPU, empty outside Kubernetes) to keep cardinality low; what a GPU is, its reference clock and
its dense peaks are separate series to join on ``uuid``. A GPU whose window is
stale exports ``kernelfleet_sample_stale 1`` and no counters, never zeros; a
counter a GPU lacks is simply absent for that GPU. The job label is ``job_id``:
``job`` is the scrape target's label in Prometheus and would be renamed. The device families
(memory, temperature, throttle reasons, Xid, ECC, links) are in ``exporter_devices``; dcgm-exporter's
label names, as an option, in ``exporter_labels``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from kernelfleet.catalog import TENSOR_PRECISIONS
from kernelfleet.fleet.exporter_devices import check_process_series, device_families
from kernelfleet.fleet.exporter_labels import check_style, dcgm_labels
from kernelfleet.fleet.reading import JobShare, Reading

POD_LABELS = ("namespace", "pod", "container")
LABELS = ("gpu", "uuid", "model", "hostname", "mig", *POD_LABELS)

# metric name, help, how to read it from a Reading
_GAUGES: tuple[tuple[str, str, Callable[[Reading], float | None]], ...] = (
    ("kernelfleet_ofu_ratio", "Overall FLOP Utilization: tensor-pipe activity x SM clock / reference clock.",
     lambda r: r.ofu.ofu_ratio),
    ("kernelfleet_tensor_active_ratio", "Fraction of cycles any tensor pipe was busy (GPM).", lambda r: r.sample.tensor_active_ratio),
    ("kernelfleet_sm_clock_hertz", "SM clock averaged over the window.", lambda r: r.sample.sm_clock_mean_hertz),
    ("kernelfleet_sm_active_ratio", "Fraction of SMs busy (GPM).", lambda r: r.sample.sm_active_ratio),
    ("kernelfleet_sm_occupancy_ratio", "Resident warps over the maximum (GPM).", lambda r: r.sample.sm_occupancy_ratio),
    ("kernelfleet_dram_bandwidth_ratio", "DRAM bandwidth used over its peak (GPM).", lambda r: r.sample.dram_bandwidth_ratio),
    ("kernelfleet_power_watts", "Board power.", lambda r: r.sample.power_mean_watts),
    ("kernelfleet_window_seconds", "Length of the window the values cover.", lambda r: r.sample.window_seconds),
    ("kernelfleet_sample_timestamp_seconds", "Unix time at the end of the window.", lambda r: r.sample.timestamp_seconds),
)


class OfuCollector(Collector):
    """Reads ``readings()`` at every scrape; one failing GPU or field never stops the others.

    ``label_names="dcgm"`` names the labels as dcgm-exporter does; ``process_series_per_gpu``
    (default 0: none) exports the memory of that many of each GPU's largest processes.
    """

    def __init__(self, readings: Callable[[], Sequence[Reading]], label_names: str = "kernelfleet",
                 process_series_per_gpu: int = 0) -> None:
        self.readings = readings
        self.label_names = check_style(label_names)
        self.process_series_per_gpu = check_process_series(process_series_per_gpu)

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        readings = self.readings()
        families = [*self._families(readings),
                    *device_families(readings, LABELS, _labels, self.process_series_per_gpu)]
        if self.label_names == "dcgm":
            yield from dcgm_labels(families, {r.sample.uuid: r.sample.name for r in readings})
        else:
            yield from families

    def _families(self, readings: Sequence[Reading]) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        families = {name: GaugeMetricFamily(name, text, labels=LABELS) for name, text, _ in _GAUGES}
        stale = GaugeMetricFamily("kernelfleet_sample_stale", "1 when the last window could not be read.", labels=LABELS)
        ref = GaugeMetricFamily("kernelfleet_reference_clock_hertz", "The clock OFU is normalised by.", labels=("uuid", "source"))
        peak = GaugeMetricFamily("kernelfleet_dense_peak_flops", "Datasheet dense peak FLOP/s per precision.",
                                 labels=("uuid", "precision"))
        info = InfoMetricFamily("kernelfleet_gpu", "What a GPU is.", labels=("uuid", "hostname", "gpu", "name", "sku"))
        jobs = InfoMetricFamily("kernelfleet_job", "A job holding a GPU (join on uuid, mig).",
                                labels=("uuid", "mig", "job_id", "kind", "user", *POD_LABELS))
        share = GaugeMetricFamily("kernelfleet_job_gpu_share_ratio",
                                  "A job's share of a GPU; below 1 when shared (split by per-process SM use, approximate).",
                                  labels=("uuid", "mig", "job_id"))
        # one series a GPU at a time (the class of its last window), so a job's bottleneck mix is
        # count_over_time by class; at most the seven classes a GPU ever shows
        bottleneck = GaugeMetricFamily("kernelfleet_bottleneck_class", "1 for the bottleneck class of the last window "
                                       "(ofu/bottleneck.py: tensor-bound, memory-bound, ...).",
                                       labels=("uuid", "mig", "class"))
        seen: set[str] = set()
        for r in readings:
            labels = _labels(r)
            stale.add_metric(labels, 1.0 if r.sample.stale else 0.0)
            mig = labels[LABELS.index("mig")]
            for j in r.jobs:
                jobs.add_metric([r.sample.uuid, mig, j.job, j.kind, j.user or "", *_pod(j)], {})
                share.add_metric([r.sample.uuid, mig, j.job], j.share)
            if not r.sample.stale:
                bottleneck.add_metric([r.sample.uuid, mig, r.bottleneck], 1.0)
                for name, _, read in _GAUGES:
                    value = read(r)
                    if value is not None and math.isfinite(value):  # NaN or Inf is no reading
                        families[name].add_metric(labels, float(value))
            if r.sample.uuid in seen:
                continue  # MIG slices share their GPU's identity series
            seen.add(r.sample.uuid)
            info.add_metric([r.sample.uuid, r.host, str(r.sample.gpu_index), r.sample.name, r.sku.key if r.sku else ""], {})
            if r.ofu.reference_clock_hertz is not None:
                ref.add_metric([r.sample.uuid, r.ofu.reference_clock_source], r.ofu.reference_clock_hertz)
            if r.sku is not None:
                for precision in TENSOR_PRECISIONS:
                    value = r.sku.peak_flops(precision)
                    if value is not None:
                        peak.add_metric([r.sample.uuid, precision], value)
        yield from families.values()
        yield from (stale, ref, peak, info, jobs, share, bottleneck)


def _labels(r: Reading) -> list[str]:
    s = r.sample
    # The holder's names only when one job holds the GPU: a time-shared GPU's jobs are on
    # kernelfleet_job_info, so a GPU stays one series, never one per pod.
    holder = _pod(r.jobs[0]) if len(r.jobs) == 1 else ["", "", ""]
    return [str(s.gpu_index), s.uuid, r.sku.key if r.sku else s.name, r.host,
            "" if s.mig_instance is None else str(s.mig_instance), *holder]


def _pod(j: JobShare) -> list[str]:
    return [j.namespace or "", j.pod or "", j.container or ""]
