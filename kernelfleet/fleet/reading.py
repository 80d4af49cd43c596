"""What the agent knows of one GPU's latest window: the record its clients (the exporter, the
API, the dashboard) read, so none of them imports the sampling loop."""

from __future__ import annotations

from dataclasses import dataclass

from kernelfleet.catalog import Sku
from kernelfleet.ofu import OfuReading
from kernelfleet.telemetry.sample import Sample


@dataclass(frozen=True, slots=True)
class JobShare:
    """A job's hold on one GPU in one window."""

    job: str
    kind: str
    user: str | None
    share: float  # of the GPU, by per-process SM use when shared
    approximate: bool  # the GPU was shared by several jobs
    # Who holds the GPU in Kubernetes (None outside it; pod and container None when several do)
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None


@dataclass(frozen=True, slots=True)
class Reading:
    """The latest window of one GPU, as the exporter and the API show it."""

    host: str
    sample: Sample
    sku: Sku | None
    ofu: OfuReading
    bottleneck: str
    jobs: tuple[JobShare, ...] = ()
