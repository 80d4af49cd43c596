"""The agent: every window, turn a batch of samples into OFU readings, keep the latest
for the exporter and the API, and write them to the store."""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from kernelfleet.catalog import Catalog, Sku
from kernelfleet.fleet.store import GpuRow, Store
from kernelfleet.ofu import OfuReading, classify, ofu
from kernelfleet.telemetry.sample import Sample

log = logging.getLogger(__name__)


class Source(Protocol):
    def batches(self, count: int | None = None) -> Iterable[list[Sample]]: ...


@dataclass(frozen=True, slots=True)
class Reading:
    """The latest window of one GPU, as the exporter and the API show it."""

    host: str
    sample: Sample
    sku: Sku | None
    ofu: OfuReading
    bottleneck: str


class Agent:
    """Consumes a source; thread-safe ``latest()`` for readers."""

    def __init__(
        self,
        source: Source,
        store: Store | None,
        catalog: Catalog,
        host: str | None = None,
        retention_every_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.store = store
        self.catalog = catalog
        self.host = host or socket.gethostname()
        self.retention_every_seconds = retention_every_seconds
        self.clock = clock
        self._latest: dict[tuple[str, int | None], Reading] = {}
        self._lock = threading.Lock()
        self._last_retention = 0.0
        self.windows = 0

    def step(self, batch: list[Sample]) -> list[Reading]:
        """Handle one batch: readings for the exporter and API, rows for the store."""
        readings = []
        for sample in batch:
            sku = self.catalog.lookup(sample.name, sample.pci_device_id)
            readings.append(Reading(self.host, sample, sku, ofu(sample, sku), classify(sample).value))
        with self._lock:
            for r in readings:
                self._latest[r.sample.uuid, r.sample.mig_instance] = r
        if self.store is not None:
            self.store.write([_row(r) for r in readings])
            now = self.clock()
            if now - self._last_retention >= self.retention_every_seconds:
                self.store.enforce_retention(now)
                self._last_retention = now
        self.windows += 1
        return readings

    def latest(self) -> list[Reading]:
        with self._lock:
            return sorted(self._latest.values(), key=lambda r: (r.sample.gpu_index, r.sample.mig_instance or -1))

    def run(self, stop: threading.Event) -> None:
        """Step through the source until it ends or ``stop`` is set."""
        for batch in self.source.batches():
            self.step(batch)
            if stop.is_set():
                break


def _row(r: Reading) -> GpuRow:
    s = r.sample
    return GpuRow(
        host=r.host, uuid=s.uuid, mig_instance=s.mig_instance, gpu_index=s.gpu_index, name=s.name,
        sku=r.sku.key if r.sku else None, ts=s.timestamp_seconds, window_seconds=s.window_seconds,
        bottleneck=r.bottleneck, stale=s.stale, ofu=r.ofu.ofu_ratio, tensor_active=s.tensor_active_ratio,
        sm_clock_hertz=s.sm_clock_mean_hertz, sm_active=s.sm_active_ratio, sm_occupancy=s.sm_occupancy_ratio,
        dram_bandwidth=s.dram_bandwidth_ratio, power_watts=s.power_mean_watts,
    )
