"""Counter source on an existing dcgm-exporter: read its ``/metrics``; no agent of ours on the node.

Every interval the source GETs the exporter's Prometheus text and yields one
:class:`Sample` per GPU and per MIG GPU instance. OFU needs
``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` (NVML's GPM tensor utilisation / 100, DESIGN.md)
and ``DCGM_FI_DEV_SM_CLOCK``. What the exporter cannot give, and what that costs:

* **The clock is one read per scrape**, not a mean: ``sm_clock_mean_hertz`` is
  that read and ``sm_clock_polls=1``. One read per 1-s window is 6.2 % off at p95
  under transformer training on an H200 (docs/telemetry.md), and OFU inherits the
  error one-for-one. A longer window does not make one read closer to that window's
  mean: on the same recording (``clock_sampling_errors``, 64 phases) the mean error is
  2.4 % for 1-s windows and 3.6 % for its one 9-s window. Errors average out only
  across many windows. Where OFU must be exact per window, use ``NvmlSource``.
* **The averaging window is DCGM's**: profiling fields are means over DCGM's update
  period (dcgm-exporter ``-c``, 30 s by default); scraping faster repeats values.
* **MIG**: dcgm-exporter puts the *parent* GPU's UUID on a GPU instance's lines, so a
  slice is ``Sample(uuid=<parent>, mig_instance=GPU_I_ID)``, and consumers key by
  ``(uuid, mig_instance)``. The board power it repeats on each slice is dropped
  (``NvmlSource`` gives a slice no power either).
* **No processes**: who holds a GPU comes from the exporter's Kubernetes labels,
  :attr:`ScrapeSource.pods` (for the latest batch) or :func:`pod_labels` (any text).

The exporter is another program on the network, so nothing it sends is trusted: one scrape has a
deadline for the whole answer and a size cap; an answer cut short mid-line is a failed scrape
(Prometheus text ends every line with a newline, and a cut number such as a clock of "19" MHz would
otherwise read as good); every value is range-checked (a ratio in [0, 1], a clock in (0, max]); a
series that appears twice with different values is dropped for that window; more GPU entities than
one node can hold fail the scrape; and a GPU that leaves the output expires after
``expire_seconds`` instead of staying stale forever. What was rejected is counted in
:attr:`ScrapeSource.rejected` and logged once per kind.
"""

from __future__ import annotations

import http.client
import logging
import math
import socket
import time
import urllib.error
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from prometheus_client.parser import text_string_to_metric_families

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.telemetry.sample import Sample

log = logging.getLogger(__name__)

FETCH_DEADLINE_SECONDS = 10.0  # for the whole answer, connect to last byte
MIB = 1024 * 1024
MAX_BODY_BYTES = 16 * MIB  # an 8-GPU node with every profiling field answers ~0.2 MiB
MAX_GPUS = 256  # GPU entities one node can show: 16 GPUs x 7 MIG instances, twice over
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
# DCGM writes "blank" sentinels (not found, not supported, ...) as values at or above 2**47
# (DCGM_FP64_BLANK; the int64 ones are near 2**63), dcgm_structs.h. None of our fields comes
# near: NVLink's 900 GB/s is 1e12.
DCGM_BLANK = 2.0**47

# dcgm-exporter metric -> (Sample field, scale to our unit). DCGM_FI_PROF_* ratios are 0-1,
# link rates bytes/s (DCGM field docs); the clock MHz, power W, framebuffer MiB.
FIELDS: dict[str, tuple[str, float]] = {
    TENSOR_ACTIVE: ("tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_bandwidth_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("fp64_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_active_ratio", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_per_second", 1.0),
    SM_CLOCK: ("sm_clock_mean_hertz", 1e6),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("sm_clock_max_hertz", 1e6),
    "DCGM_FI_DEV_POWER_USAGE": ("power_mean_watts", 1.0),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", MIB),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_celsius", 1.0),
    "DCGM_FI_DEV_PCI_COMBINED_ID": ("pci_device_id", 1.0),  # in no shipped CSV; read if added
}

# What a sane value of each field lies in (after scaling to our unit); outside it a value is
# rejected, not stored. Ratios are DCGM's 0-1 fractions; a clock above 10 GHz, a board above
# 5 kW, a link above 10 TB/s or more memory than 1 PiB is no GPU's. The SM clock is also held
# against the GPU's own max clock when the exporter serves it.
RANGES: dict[str, tuple[float, float]] = {
    **{name: (0.0, 1.0) for name, _ in FIELDS.values() if name.endswith("_ratio")},
    **{name: (0.0, 1e13) for name, _ in FIELDS.values() if name.endswith("_bytes_per_second")},
    "sm_clock_mean_hertz": (1.0, 1e10),
    "sm_clock_max_hertz": (1.0, 1e10),
    "power_mean_watts": (0.0, 5000.0),
    "memory_used_bytes": (0.0, 2.0**50),
    "temperature_celsius": (0.0, 200.0),  # a die past 200 C is a broken sensor, not a reading
    "pci_device_id": (0.0, 2.0**32),
}
RATIO_SLACK = 1e-6  # DCGM's float fractions may round a hair above 1; such a value reads as 1

Key = tuple[str, int | None]  # (uuid, mig_instance), the key every consumer of Samples uses


class FetchFailed(OSError):
    """A scrape that got no usable answer; ``str()`` is the reason shown on stale samples."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """A Kubernetes container that dcgm-exporter says holds a GPU (or GPU instance).

    The strings are the exporter's, unsanitised: clean them before using them as labels.
    """

    namespace: str
    pod: str
    container: str | None
    workload: str | None = None  # what made the pod, where the API server said (telemetry/kubeapi.py)


def http_get(url: str, deadline_seconds: float = FETCH_DEADLINE_SECONDS, max_bytes: int = MAX_BODY_BYTES,
             clock: Callable[[], float] = time.monotonic) -> str:
    """GET ``url`` and return its body as text; the default ``fetch`` of :class:`ScrapeSource`.

    The whole answer must arrive within ``deadline_seconds`` (each socket wait gets what is left
    of it, so an endpoint that drips a byte at a time cannot hold the sampler) and be at most
    ``max_bytes``; otherwise :class:`FetchFailed` says which.
    """
    parts = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    end = clock() + deadline_seconds
    connection = connection_class(parts.hostname or "", parts.port, timeout=deadline_seconds)
    try:
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        sock = connection.sock  # the response reads through it even after the connection lets it go
        response = connection.getresponse()
        if response.status != 200:
            raise FetchFailed(f"HTTP {response.status} {response.reason}")
        declared = response.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise FetchFailed(f"answer of {int(declared) / MIB:.1f} MiB, over the {max_bytes / MIB:g} MiB cap")
        body = bytearray()
        while True:
            left = end - clock()
            if left <= 0:
                raise FetchFailed(f"no whole answer within {deadline_seconds:g} s")
            sock.settimeout(left)
            chunk = response.read1(65536)
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise FetchFailed(f"answer over the {max_bytes / MIB:g} MiB cap")
        charset = response.headers.get_content_charset() or "utf-8"
        return body.decode(charset)
    except TimeoutError:  # socket.timeout is TimeoutError
        raise FetchFailed("timed out") from None
    except (ConnectionError, socket.gaierror) as exc:
        raise FetchFailed(f"unreachable ({exc})") from None
    finally:
        connection.close()


def pod_labels(text: str) -> dict[Key, tuple[PodRef, ...]]:
    """The pods holding each GPU / GPU instance in one dcgm-exporter response.

    Keyed like Samples, ``(uuid, mig_instance)``; a GPU no pod holds is absent.
    Several pods appear when a GPU is shared (time-slicing). ``ValueError`` if the
    text is not Prometheus text.
    """
    return _parse(text).pods


@dataclass
class _Gpu:
    """What one scrape said about one GPU or GPU instance."""

    gpu_index: int
    uuid: str
    name: str
    mig_instance: int | None
    host: str | None = None  # the exporter's Hostname label: the node the GPU is in
    values: dict[str, float] = field(default_factory=dict)
    served: set[str] = field(default_factory=set)  # fields with a line, blank or not

    @property
    def gpm_supported(self) -> bool:
        # A blank tensor value is a missing window; no line at all is no profiling.
        return "tensor_active_ratio" in self.served

    def sample(self, timestamp: float, window: float) -> Sample:
        values: dict[str, float | int | None] = dict(self.values)
        if self.mig_instance is not None:
            # the board's power and die temperature, repeated on each slice: the whole GPU's, not a slice's
            values.pop("power_mean_watts", None)
            values.pop("temperature_celsius", None)
        if "memory_used_bytes" in values:
            values["memory_used_bytes"] = int(self.values["memory_used_bytes"])
        if "pci_device_id" in values:  # NVML's (device << 16) | vendor: keep the device id
            values["pci_device_id"] = int(self.values["pci_device_id"]) >> 16
        clock = self.values.get("sm_clock_mean_hertz")
        return Sample(
            timestamp_seconds=timestamp,
            window_seconds=window,
            **self._identity(),
            sm_clock_instant_hertz=clock,  # the same single read as the "mean"
            sm_clock_polls=0 if clock is None else 1,
            **values,  # type: ignore[arg-type]
        )

    def stale(self, timestamp: float, window: float, error: str) -> Sample:
        return Sample(timestamp_seconds=timestamp, window_seconds=window, stale=True, error=error, **self._identity())

    def _identity(self) -> dict[str, Any]:
        return {
            "gpu_index": self.gpu_index,
            "uuid": self.uuid,
            "name": self.name,
            "mig_instance": self.mig_instance,
            "gpm_supported": self.gpm_supported,
        }


@dataclass
class _Scrape:
    gpus: dict[Key, _Gpu]
    pods: dict[Key, tuple[PodRef, ...]]
    rejected: Counter[str] = field(default_factory=Counter)  # why values were not kept, by kind


def _parse(text: str) -> _Scrape:
    """Group one response's DCGM lines by GPU, keeping only values that can be true;
    ``ValueError`` if it is not (whole) Prometheus text or names more GPUs than a node has."""
    if text and not text.endswith("\n"):
        raise ValueError("the answer was cut short mid-line")
    gpus: dict[Key, _Gpu] = {}
    pods: dict[Key, list[PodRef]] = {}
    rejected: Counter[str] = Counter()
    conflicting: set[tuple[Key, str]] = set()
    # The parser is lazy: a malformed line raises here, while iterating.
    for family in text_string_to_metric_families(text):
        for line in family.samples:
            # The parser names a counter's lines "<name>_total"; DCGM's rates are the same
            # numbers whichever type the counters CSV declares.
            metric = family.name if family.type == "counter" else line.name
            if metric not in FIELDS:
                continue
            labels = line.labels
            key = _key(labels)
            if key is None:
                continue  # not a GPU entity (NVSwitch, CPU) or no way to name it
            gpu = gpus.get(key)
            if gpu is None:
                if len(gpus) == MAX_GPUS:
                    raise ValueError(f"more than {MAX_GPUS} GPUs in one answer: not one node's exporter")
                gpu = gpus[key] = _Gpu(int(labels["gpu"]), key[0], labels.get("modelName", ""), key[1],
                                       labels.get("Hostname") or None)
            name, scale = FIELDS[metric]
            first = name not in gpu.served
            gpu.served.add(name)
            blank = math.isnan(line.value) or abs(line.value) >= DCGM_BLANK  # DCGM's "no value", no error
            value = None if blank else _checked(name, line.value * scale, rejected)
            if not first:  # the same series twice: keep it only where both lines agree
                if gpu.values.get(name) != value:
                    rejected["duplicate"] += 1
                    conflicting.add((key, name))
            elif value is not None:
                gpu.values[name] = value
            pod = _pod(labels)
            if pod is not None and pod not in pods.setdefault(key, []):
                pods[key].append(pod)
    for key, name in conflicting:
        gpus[key].values.pop(name, None)
    for gpu in gpus.values():
        clock, top = gpu.values.get("sm_clock_mean_hertz"), gpu.values.get("sm_clock_max_hertz")
        if clock is not None and top is not None and clock > top * (1 + RATIO_SLACK):
            rejected["out_of_range"] += 1
            del gpu.values["sm_clock_mean_hertz"]
    return _Scrape(gpus, {k: tuple(v) for k, v in pods.items() if v}, rejected)


def _checked(name: str, value: float, rejected: Counter[str]) -> float | None:
    """``value`` if it can be true of field ``name``, else None (counted)."""
    low, high = RANGES[name]
    if name.endswith("_ratio") and high < value <= high + RATIO_SLACK:
        return high
    if not low <= value <= high:
        rejected["out_of_range"] += 1
        return None
    return value


def _key(labels: dict[str, str]) -> Key | None:
    if not labels.get("gpu", "").isdigit():
        return None
    # "uuid" is dcgm-exporter's label name under --use-old-namespace.
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        host = labels.get("Hostname")
        uuid = f"{host}/gpu{labels['gpu']}" if host else f"gpu{labels['gpu']}"
    instance = labels.get("GPU_I_ID", "")
    return uuid, int(instance) if instance.isdigit() else None


def _pod(labels: dict[str, str]) -> PodRef | None:
    # Older exporters write pod="" on GPUs no pod holds.
    if not labels.get("pod"):
        return None
    return PodRef(labels.get("namespace", ""), labels["pod"], labels.get("container") or None)


@dataclass
class ScrapeSource:
    """Samples from a dcgm-exporter ``/metrics`` URL, one batch every ``interval_seconds``.

    >>> with ScrapeSource("http://gpu-node-7:9400/metrics") as source:  # doctest: +SKIP
    ...     for batch in source.batches():
    ...         owners = source.pods  # {(uuid, mig_instance): (PodRef, ...)} for this batch

    A failed scrape (unreachable, HTTP error, past its deadline or size cap, cut short, not
    Prometheus text, no GPU lines) yields a stale Sample for every GPU seen before, with the
    reason; if no GPU was ever seen it raises :class:`EnvironmentProblem`. A GPU that drops out
    of the exporter's output stays in every batch as stale until ``expire_seconds`` have passed
    since it was last seen; then it is forgotten.
    """

    url: str
    interval_seconds: float = 30.0
    fetch: Callable[[str], str] = http_get
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    expire_seconds: float = 600.0
    # Values and scrapes refused since the start, by kind: out_of_range, duplicate, failed.
    rejected: Counter[str] = field(default_factory=Counter, init=False)
    # Pods holding each GPU in the latest batch; empty after a failed scrape (unknown).
    pods: dict[Key, tuple[PodRef, ...]] = field(default_factory=dict, init=False)
    hosts: dict[Key, str] = field(default_factory=dict, init=False)  # the node of each GPU seen
    _known: dict[Key, _Gpu] = field(default_factory=dict, init=False)
    _seen: dict[Key, float] = field(default_factory=dict, init=False)  # when each GPU last answered
    _previous: float | None = field(default=None, init=False)
    _answered: bool = field(default=False, init=False)  # some scrape has named a GPU
    _warned: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        if urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            raise UsageError(f"--scrape expects an http(s) URL such as http://HOST:9400/metrics, got {self.url!r}")
        if not self.interval_seconds > 0:
            raise UsageError(f"--interval must be positive, got {self.interval_seconds}")
        if not self.expire_seconds > 0:
            raise UsageError(f"expire_seconds must be positive, got {self.expire_seconds}")

    def open(self) -> ScrapeSource:
        return self

    def close(self) -> None:
        pass  # nothing held between scrapes: each GET opens and closes its connection

    def __enter__(self) -> ScrapeSource:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self, count: int | None = None) -> Iterator[list[Sample]]:
        """Scrape at once, then every ``interval_seconds`` on a fixed schedule."""
        emitted = 0
        next_tick = self.clock()
        while count is None or emitted < count:
            if (left := next_tick - self.clock()) > 0:
                self.sleep(left)
            yield self.read()
            emitted += 1
            next_tick += self.interval_seconds
            if next_tick < self.clock():
                # Fell behind (a slow exporter, a paused process): skip the missed ticks
                # rather than scrape in a burst.
                next_tick += math.ceil((self.clock() - next_tick) / self.interval_seconds) * self.interval_seconds

    def read(self) -> list[Sample]:
        """Scrape once now: one Sample per GPU / GPU instance."""
        now, timestamp = self.clock(), self.wall()
        window = self.interval_seconds if self._previous is None else now - self._previous
        self._previous = now
        try:
            scrape = _parse(self.fetch(self.url))
        except (OSError, http.client.HTTPException, UnicodeDecodeError) as exc:
            return self._failed(_fetch_error(exc), timestamp, window)
        except ValueError as exc:
            return self._failed(f"not Prometheus text ({exc})", timestamp, window)
        if not scrape.gpus:
            return self._failed(f"no GPU lines of the DCGM fields kernelfleet reads ({TENSOR_ACTIVE}, {SM_CLOCK}, ...)", timestamp, window)
        self._warn_unsupported(list(scrape.gpus.values()))
        for kind, count in scrape.rejected.items():
            self.rejected[kind] += count
            self._warn_once(f"rejected-{kind}", f"{self.url}: {count} {kind.replace('_', ' ')} value(s) "
                            "rejected in one scrape (counted in ScrapeSource.rejected; logged once)")
        self._expire(now, seen=scrape.gpus)
        self._answered = True
        self._known.update(scrape.gpus)
        self.pods = scrape.pods
        self.hosts.update({key: gpu.host for key, gpu in scrape.gpus.items() if gpu.host})
        batch = [gpu.sample(timestamp, window) for gpu in scrape.gpus.values()]
        gone = "no longer in the exporter's output"
        batch += [gpu.stale(timestamp, window, gone) for key, gpu in self._known.items() if key not in scrape.gpus]
        return batch

    def _expire(self, now: float, seen: dict[Key, _Gpu]) -> None:
        """Mark ``seen`` as answering now; forget GPUs silent for longer than ``expire_seconds``."""
        self._seen.update(dict.fromkeys(seen, now))
        for key in [k for k, last in self._seen.items() if now - last > self.expire_seconds]:
            del self._seen[key]
            self._known.pop(key, None)
            self.hosts.pop(key, None)

    def _failed(self, error: str, timestamp: float, window: float) -> list[Sample]:
        self.rejected["failed"] += 1
        self._expire(self.clock(), seen={})
        # Only an exporter that never named a GPU is a broken set-up. One that did and is down for
        # longer than its GPUs' expiry is an outage the agent outlives: it once exited here.
        if not self._answered:
            raise EnvironmentProblem(
                f"cannot read GPU metrics from {self.url}: {error}; check that dcgm-exporter "
                "runs there and this host can reach it (curl the URL)"
            )
        log.warning("scrape failed: %s", error)
        self.pods = {}
        return [gpu.stale(timestamp, window, error) for gpu in self._known.values()]

    def _warn_unsupported(self, gpus: list[_Gpu]) -> None:
        lacking = [gpu for gpu in gpus if not gpu.gpm_supported]
        if lacking and len(lacking) == len(gpus):
            self._warn_once(
                "no-prof",
                f"{self.url} serves no {TENSOR_ACTIVE}, so no OFU: enable the DCGM_FI_PROF_* fields "
                "in dcgm-exporter's counters CSV (-f; its etc/dcp-metrics-included.csv has them)",
            )
        elif lacking:  # profiling is on, but these GPUs (pre-Volta, some vGPUs) cannot give it
            for gpu in lacking:
                self._warn_once(
                    f"no-prof-{gpu.uuid}-{gpu.mig_instance}",
                    f"{self.url}: GPU {gpu.gpu_index} ({gpu.name or 'unnamed'}) has no {TENSOR_ACTIVE}, so no OFU",
                )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)


def _fetch_error(exc: BaseException) -> str:
    if isinstance(exc, FetchFailed):
        return str(exc)
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):  # urllib wraps a connect timeout, not a read timeout
        return "timed out"
    if isinstance(exc, urllib.error.URLError):
        return f"unreachable ({exc.reason})"
    return f"{type(exc).__name__}: {exc}"
