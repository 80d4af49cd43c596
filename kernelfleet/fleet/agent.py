"""The agent: every window, turn a batch of samples into OFU readings, keep the latest
for the exporter and the API, and write them to the store."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from kernelfleet.catalog import Catalog, Sku
from kernelfleet.errors import UsageError
from kernelfleet.fleet import store_retention
from kernelfleet.fleet.attribution import JobIdentity, attribute, clean, split_shared
from kernelfleet.fleet.detect import Event, RegressionDetector
from kernelfleet.fleet.pods import pod_jobs
from kernelfleet.fleet.reading import JobShare, Reading
from kernelfleet.fleet.store import Batch, GpuKey, Hold, Store
from kernelfleet.ofu import classify, corrected_ofu, ofu
from kernelfleet.telemetry.sample import ProcessSample, Sample
from kernelfleet.telemetry.scrape import PodRef

log = logging.getLogger(__name__)
MAX_HOOK_JOBS = 1024  # jobs whose last hook report is kept; any client of the port can post one
STALE_WINDOWS = 2  # a GPU missing from this many windows in a row is stale
# The sampler is stale when no window has come for this many windows' length (at least the floor):
# /healthz then fails, and every reading is shown stale.
SAMPLER_STALE_WINDOWS, SAMPLER_STALE_FLOOR_SECONDS = 3, 10.0
# A window dated this far ahead of the agent's clock is refused (a node's clock may run a little
# ahead; a year is a bad clock); one older than the store keeps raw windows is refused too.
MAX_FUTURE_SECONDS, MAX_PAST_SECONDS = 300.0, 24 * 3600.0


class Source(Protocol):
    def batches(self, count: int | None = None) -> Iterable[list[Sample]]: ...


def attribute_recorded(process: ProcessSample) -> JobIdentity:
    """For replayed traces: the recording's PIDs mean nothing on this machine, so a
    process is its own job, named from what the recording says about it."""
    return JobIdentity(process.pid, clean(f"{process.name or 'pid'}-{process.pid}"), "recorded",
                       None, None, None, None, None, None, None)


def attribute_live(process: ProcessSample) -> JobIdentity:
    return attribute(process.pid)


class Agent:
    """Consumes a source; thread-safe ``latest()`` for readers."""

    def __init__(
        self,
        source: Source,
        store: Store | None,
        catalog: Catalog,
        host: str | None = None,
        retention_every_seconds: float = store_retention.EVERY_SECONDS,
        clock: Callable[[], float] = time.time,
        identify: Callable[[ProcessSample], JobIdentity] = attribute_live,
        detector: RegressionDetector | None = None,
        pods: Callable[[Sample], Sequence[PodRef]] | None = None,
        hosts: Callable[[], Mapping[tuple[str, int | None], str]] | None = None,
        expire_seconds: float = 300.0,
    ) -> None:
        self.source = source
        self.store = store
        self.catalog = catalog
        self.host = host or socket.gethostname()
        self.retention_every_seconds = retention_every_seconds
        self.clock = clock
        self.identify = identify
        self.pods = pods  # the containers Kubernetes gave a GPU (dcgm-exporter's labels, the kubelet's)
        self.hosts = hosts  # ... and the node of each GPU, which is not this machine
        self.detector = detector if detector is not None else RegressionDetector()
        self.hooks: dict[str, dict[str, object]] = {}  # the last hook report per job
        self.mfu_margin = 0.10
        self._pending: list[Event] = []
        self._latest: dict[tuple[str, int | None], Reading] = {}
        self._missed: dict[tuple[str, int | None], int] = {}  # windows in a row each GPU was absent from
        self._newest = 0.0  # the newest window's timestamp: the time GPUs' ages are measured on
        self._window_seconds = 1.0
        self._lock = threading.Lock()
        self._last_retention = 0.0
        self.rejected: Counter[str] = Counter()  # windows refused for their date: "future", "past"
        self.expire_seconds = expire_seconds  # a GPU silent this long leaves latest(), /metrics and the fleet
        self._last_step = clock()  # the start counts as a step: a probe passes until the first window is due
        self.windows = 0

    def step(self, batch: list[Sample]) -> list[Reading]:
        """Handle one batch: readings for the exporter and API, rows for the store. Windows dated
        in the future or the far past (against the agent's clock) are refused and counted in
        ``rejected``: they never reach the store or move its clock."""
        batch = self._in_time(batch)
        readings = []
        for sample in batch:
            sku = self.catalog.lookup(sample.name, sample.pci_device_id)
            host = self.hosts().get((sample.uuid, sample.mig_instance), self.host) if self.hosts else self.host
            readings.append(Reading(host, sample, sku, ofu(sample, sku), classify(sample).value, self._jobs(sample)))
        with self._lock:
            for key in self._missed:
                self._missed[key] += 1
            for r in readings:
                key = r.sample.uuid, r.sample.mig_instance
                self._latest[key], self._missed[key] = r, 0
            if batch:
                self._newest = max(self._newest, max(s.timestamp_seconds for s in batch))
                self._window_seconds = max(s.window_seconds for s in batch)
            self._last_step = self.clock()
        events = self._detect(readings)
        if self.store is not None:
            if readings:
                self.store.write_batch(_batch(readings))  # one transaction: the windows and their jobs
            for event in events:
                uuid = event.key[1] if event.key[0] == "gpu" else None
                job = event.key[1] if event.key[0] == "job" else None
                self.store.add_event(event.ts, event.kind, event.describe(), gpu_uuid=uuid, job=job)
            # Retention runs on the agent's clock: one window dated a year ahead once deleted every
            # sample, rollup and event. (A recording replayed into a store is rebased to now.)
            now = self.clock()
            if now - self._last_retention >= self.retention_every_seconds:
                self.store.enforce_retention(now)
                self._last_retention = now
        self.windows += 1
        return readings

    def _in_time(self, batch: list[Sample]) -> list[Sample]:
        now = self.clock()
        oldest = now - (self.store.retention.raw_seconds if self.store is not None else MAX_PAST_SECONDS)
        kept = []
        for sample in batch:
            when = "future" if sample.timestamp_seconds > now + MAX_FUTURE_SECONDS else \
                "past" if sample.timestamp_seconds < oldest else None
            if when is None:
                kept.append(sample)
                continue
            self.rejected[when] += 1
            if self.rejected[when] == 1:
                log.warning("refused a window of %s dated %+.0f s from this machine's clock (%s); such windows are "
                            "counted, not stored", sample.uuid, sample.timestamp_seconds - now, when)
        return kept

    def _jobs(self, sample: Sample) -> tuple[JobShare, ...]:
        """Which jobs held this GPU: the workloads of the pods Kubernetes gave it where it says, else
        its processes' jobs; a shared GPU is split by per-process SM use (approximate)."""
        refs = self.pods(sample) if self.pods is not None else ()
        if refs:
            return pod_jobs(refs)
        if not sample.processes:
            return ()
        shares = split_shared({p.pid: p.sm_active_ratio for p in sample.processes})
        by_job: dict[str, list[float | str | None]] = {}
        for process in sample.processes:
            who = self.identify(process)
            if who.job is None:
                continue
            entry = by_job.setdefault(who.job, [0.0, who.kind, who.user])
            entry[0] = float(entry[0]) + shares.get(process.pid, 0.0)  # type: ignore[arg-type]
        shared = len(by_job) > 1
        return tuple(JobShare(job, str(kind), user, float(share), shared)  # type: ignore[arg-type]
                     for job, (share, kind, user) in sorted(by_job.items()))

    def _detect(self, readings: list[Reading]) -> list[Event]:
        """Feed every GPU and every job to the detector; log and keep what it raises."""
        per_job: dict[str, list[tuple[float, float, float, float]]] = {}
        for r in readings:
            s = r.sample
            self._raise(self.detector.observe(("gpu", s.uuid, s.mig_instance), s.timestamp_seconds,
                                              r.ofu.ofu_ratio, s.sm_active_ratio))
            if r.ofu.ofu_ratio is not None and s.sm_active_ratio is not None:
                for j in r.jobs:
                    per_job.setdefault(j.job, []).append((s.timestamp_seconds, r.ofu.ofu_ratio, s.sm_active_ratio, j.share))
        for job, rows in per_job.items():
            weight = sum(share for *_, share in rows) or 1.0
            job_ofu = sum(o * share for _, o, _, share in rows) / weight
            job_sm = sum(sm * share for _, _, sm, share in rows) / weight
            self._raise(self.detector.observe(("job", job), max(t for t, *_ in rows), job_ofu, job_sm))
        raised, self._pending = self._pending, []
        return raised

    def _raise(self, event: Event | None) -> None:
        if event is not None:
            log.warning("%s: %s", event.kind, event.describe())
            self._pending.append(event)

    def hook(self, report: dict[str, object]) -> dict[str, object]:
        """A report from kernelfleet.hook: the job's useful FLOPs give its MFU; with its profiled
        step's executed FLOPs, its tile-corrected OFU (:func:`tile_corrected_ofu`).

        A job whose own MFU figure disagrees with its OFU by more than ``mfu_margin`` gets an
        ``mfu-mismatch`` event. The corrected OFU is the one compared when there is one: on
        shapes that are not tile multiples the GEMM kernels compute padded tiles, which keep
        the tensor pipes busy and so count in raw OFU but are rightly no part of the job's
        FLOPs, so raw OFU exceeds a correct MFU and would flag an honest job.
        """
        pid = int(report["pid"])  # type: ignore[arg-type]
        who = self.identify(ProcessSample(pid=pid))
        job = who.job or f"pid-{pid}"
        held = [(r, j.share) for r in self.latest() for j in r.jobs if j.job == job]
        gpus = sum(share for _, share in held)
        skus = {r.sku for r, _ in held}
        sku = next(iter(skus)) if len(skus) == 1 else None
        mfu = None
        seconds = float(report["seconds"])  # type: ignore[arg-type]
        if gpus > 0 and sku is not None and seconds > 0:
            peaks = {p: sku.peak_flops(p) for p in report["useful_flops"]}  # type: ignore[union-attr, attr-defined]
            if all(peaks.values()):
                mfu = sum(f / peaks[p] for p, f in report["useful_flops"].items()) / seconds / gpus  # type: ignore[union-attr, operator]
        ofus = [(r.ofu.ofu_ratio, share) for r, share in held if r.ofu.ofu_ratio is not None]
        ofu_now = sum(o * w for o, w in ofus) / sum(w for _, w in ofus) if ofus else None
        useful, executed = report.get("profiled_useful_flops"), report.get("executed_flops")
        corrected, note = None, report.get("correction_note")
        if not executed or not useful:
            note = note or "the report has no executed FLOPs (no profiled step)"
        elif ofu_now is None or sku is None:
            note = "no OFU for the job's GPUs (or they are not one known model) to correct"
        else:
            corrected, note = tile_corrected_ofu(ofu_now, useful, executed, sku)  # type: ignore[arg-type]
        reported = report.get("reported_mfu")
        result = {"job": job, "gpus": gpus, "hook_mfu_ratio": mfu, "ofu_ratio": ofu_now,
                  "corrected_ofu_ratio": corrected, "correction_note": note,
                  "reported_mfu_ratio": reported, "gemms": report.get("gemms", [])}
        with self._lock:
            self.hooks.pop(job, None)
            self.hooks[job] = result  # the newest last, so the oldest go first
            while len(self.hooks) > MAX_HOOK_JOBS:
                del self.hooks[next(iter(self.hooks))]
        measured = corrected if corrected is not None else ofu_now
        if isinstance(reported, (int, float)) and measured is not None and abs(reported - measured) > self.mfu_margin:
            which = "tile-corrected OFU" if corrected is not None else "OFU"
            detail = (f"job {job} reports MFU {reported:.3f} but its GPUs' {which} is {measured:.3f}: "
                      "check the job's FLOP counting")
            log.warning(detail)
            if self.store is not None:
                self.store.add_event(self.clock(), "mfu-mismatch", detail, job=job)
        return result

    def sampler_stale(self) -> bool:
        """No window for longer than ``SAMPLER_STALE_WINDOWS`` windows (the counters or the loop hang)."""
        limit = max(SAMPLER_STALE_WINDOWS * self._window_seconds, SAMPLER_STALE_FLOOR_SECONDS)
        return self.clock() - self._last_step > limit

    def latest(self) -> list[Reading]:
        """Each GPU's last reading; stale where the GPU missed ``STALE_WINDOWS`` windows in a row or
        the sampler itself is stale (a stale reading carries no counters, so no OFU); a GPU whose
        last window is ``expire_seconds`` older than the newest is forgotten."""
        sampler_stale = self.sampler_stale()
        with self._lock:
            for key in [k for k, r in self._latest.items() if self._newest - r.sample.timestamp_seconds > self.expire_seconds]:
                del self._latest[key], self._missed[key]
            out = [self._aged(r, self._missed[key], sampler_stale) for key, r in self._latest.items()]
        return sorted(out, key=lambda r: (r.sample.gpu_index, r.sample.mig_instance or -1))

    def _aged(self, reading: Reading, missed: int, sampler_stale: bool) -> Reading:
        if reading.sample.stale or (missed < STALE_WINDOWS and not sampler_stale):
            return reading
        why = "the sampler has taken no window" if sampler_stale else f"missing from the last {missed} windows"
        sample = reading.sample.gone_stale(why)
        return Reading(reading.host, sample, reading.sku, ofu(sample, reading.sku), classify(sample).value, reading.jobs)

    def run(self, stop: threading.Event) -> None:
        """Step through the source until it ends or ``stop`` is set."""
        for batch in self.source.batches():
            self.step(batch)
            if stop.is_set():
                break


def tile_corrected_ofu(ofu_ratio: float, useful_flops: Mapping[str, float], executed_flops: Mapping[str, float],
                       sku: Sku) -> tuple[float | None, str | None]:
    """OFU with the tile padding of a job's GEMMs removed, and None or why there is none.

    OFU × useful ÷ executed, from one profiled step of the job. With several precisions each
    is weighted by the time the tensor pipes need for it, FLOPs ÷ its dense peak: OFU is a
    share of pipe time, and an fp8 FLOP takes half the pipe time of a bf16 one.
    """
    precisions = set(useful_flops) | set(executed_flops)
    peaks = {p: _peak(sku, p) for p in precisions}
    missing = sorted(p for p, peak in peaks.items() if not peak)
    if missing:
        return None, f"{sku.key} has no dense peak for {', '.join(missing)}"
    short = sorted(p for p in precisions if useful_flops.get(p, 0) > executed_flops.get(p, 0))
    if short:
        return None, f"executed FLOPs below useful ones for {', '.join(short)}: not a report from kernelfleet.hook"
    useful = sum(useful_flops.get(p, 0) / peaks[p] for p in precisions)  # type: ignore[operator]
    executed = sum(executed_flops.get(p, 0) / peaks[p] for p in precisions)  # type: ignore[operator]
    if executed <= 0:
        return None, "the profiled step executed no FLOPs"
    return corrected_ofu(ofu_ratio, useful, executed), None


def _peak(sku: Sku, precision: str) -> float | None:
    try:
        return sku.peak_flops(precision)
    except UsageError:  # a precision the catalog does not know (the hook names any dtype)
        return None


def _batch(readings: Sequence[Reading]) -> Batch:
    """The store's batch of a window: its columns made in one pass (in the order of
    store_schema.METRICS), and the jobs' holds."""
    gpus, ts, window_seconds, *metrics, names, stale = zip(*[
        (GpuKey(r.host, s.uuid, s.mig_instance, s.gpu_index, s.name, r.sku.key if r.sku else None),
         s.timestamp_seconds, s.window_seconds, r.ofu.ofu_ratio, s.tensor_active_ratio, s.sm_clock_mean_hertz,
         s.sm_active_ratio, s.sm_occupancy_ratio, s.dram_bandwidth_ratio, s.power_mean_watts, r.bottleneck, s.stale)
        for r in readings for s in (r.sample,)])
    holds = tuple(Hold(j.job, j.kind, j.user, r.host, r.sample.uuid, r.sample.mig_instance, j.share, j.approximate)
                  for r in readings for j in r.jobs)
    return Batch(gpus, ts, window_seconds, metrics, names, stale, holds)
