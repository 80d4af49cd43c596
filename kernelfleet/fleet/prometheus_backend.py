"""The dashboard's data from a Prometheus server that scrapes many agents: how the
dashboard scales past one machine (``kernelfleet dashboard --prometheus URL``).

Everything comes from PromQL over the agents' own series (kernelfleet/fleet/exporter.py);
regressions are the firing alerts of deploy/prometheus/rules.yml (a pending alert is not one yet).
Jobs are read from ``kernelfleet_job_info`` as it is now, so a job report covers the GPUs the job
holds at query time, over at most the last 24 hours: an approximation the local store does not need.

Shaped for a fleet (issue 21): charts read the recording rules of rules.yml (one series a point,
not one per GPU) and fall back to the raw series where a rule is missing (a Prometheus loaded
without rules.yml, or before its first evaluation); a range query's step grows with the range so
that a chart gets at most :data:`MAX_POINTS` points; a job's per-GPU figures select the job's GPUs
by uuid before they average a day of them.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from kernelfleet.catalog import Catalog
from kernelfleet.catalog.notes import SAME_DIE, same_die_note
from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet import gpu_pages, views
from kernelfleet.fleet.exporter import POD_LABELS
from kernelfleet.fleet.local_backend import NotFound
from kernelfleet.ofu.bottleneck import classify
from kernelfleet.telemetry.sample import Sample

SERIES = {  # store metric name -> exported series
    "ofu": "kernelfleet_ofu_ratio", "tensor_active": "kernelfleet_tensor_active_ratio",
    "sm_clock_hertz": "kernelfleet_sm_clock_hertz", "sm_active": "kernelfleet_sm_active_ratio",
    "sm_occupancy": "kernelfleet_sm_occupancy_ratio", "dram_bandwidth": "kernelfleet_dram_bandwidth_ratio",
    "power_watts": "kernelfleet_power_watts",
}
STEPS = {"raw": 15, "1m": 60, "1h": 3600}
MAX_POINTS = 1440  # a range query's points at most: a day at one a minute, what a chart can show
# Job series go on the "many" side of a join: a GPU shared by two jobs has two of them.
SHARE = "kernelfleet_job_gpu_share_ratio"
WHOLE_OFU = 'kernelfleet_ofu_ratio{mig=""}'  # whole GPUs: a MIG slice is a row of its GPU, not a GPU
WORST_RECORDED = 50
PARALLEL_QUERIES = 4  # a page's instant vectors in flight at once (Prometheus's own limit is 20)
ROWS_BY_HOST = "count by (hostname) (kernelfleet_sample_stale)"  # GPU rows (MIG instances too) per host  # rules.yml's kernelfleet:fleet_worst_gpu_ofu:bottom50


def http_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"cannot query Prometheus at {url.split('/api/')[0]}: {exc}") from exc


class PrometheusBackend:
    def __init__(self, url: str, fetch: Callable[[str], Any] = http_json, clock: Callable[[], float] = time.time):
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise UsageError(f"--prometheus expects an http(s) URL such as http://HOST:9090, got {url!r}")
        self.url = url.rstrip("/")
        self.fetch = fetch
        self.clock = clock

    def _get(self, path: str, **params: Any) -> Any:
        body = self.fetch(f"{self.url}{path}?{urllib.parse.urlencode(params, doseq=True)}")
        if body.get("status") != "success":
            raise EnvironmentProblem(f"Prometheus refused {params.get('query', path)}: {body.get('error')}")
        return body["data"]

    def _vector(self, query: str) -> list[dict[str, Any]]:
        # at the backend's clock, not Prometheus's own now: a dashboard of a past day (or a clock
        # passed in by a test or a benchmark) reads the instant it says
        return self._get("/api/v1/query", query=query, time=self.clock())["result"]

    def _scalar(self, query: str) -> float | None:
        result = self._vector(query)
        return float(result[0]["value"][1]) if result else None

    def _scalar_or(self, *queries: str) -> float | None:
        result = self._vector_or(*queries)
        return float(result[0]["value"][1]) if result else None

    def _host_gpus(self) -> dict[str, float]:
        """Whole GPUs by host, as the fleet card lists hosts and the hosts table counts them."""
        return self._by_host("kernelfleet:host_gpus:count", 'count by (hostname) (kernelfleet_sample_stale{mig=""})')

    def _by_host(self, *queries: str) -> dict[str, float]:
        """A per-host series (a recorded one, then what it records) by hostname."""
        return {s["metric"]["hostname"]: float(s["value"][1]) for s in self._vector_or(*queries)}

    def _vector_or(self, *queries: str) -> list[dict[str, Any]]:
        """The first of ``queries`` (a recorded series, then what it records) that has a result."""
        for query in queries:
            if result := self._vector(query):
                return result
        return []

    def _range_or(self, start: float, end: float, step: int, *queries: str) -> list[dict[str, Any]]:
        for query in queries:
            if result := self._get("/api/v1/query_range", query=query, start=start, end=end, step=step)["result"]:
                return result
        return []

    def health(self) -> dict[str, Any]:
        self._get("/api/v1/status/buildinfo")
        return {"ok": True, "backend": "prometheus", "url": self.url}

    def fleet(self) -> dict[str, Any]:
        """The fleet card: recorded aggregates (rules.yml's dashboard group), the raw series behind
        each where its rule is missing; never an instant vector of every GPU."""
        whole, peak = WHOLE_OFU, 'kernelfleet_dense_peak_flops{precision="bf16"}'
        achieved = self._scalar_or("kernelfleet:fleet_achieved_bf16_flops:sum",
                                   f"sum({whole} * on (uuid) group_left () {peak})")
        total_peak = self._scalar_or("kernelfleet:fleet_peak_bf16_flops:sum", f"sum({peak} and on (uuid) {whole})")
        return {
            "gpus": self._scalar_or("kernelfleet:fleet_gpus:count", 'count(kernelfleet_sample_stale{mig=""})') or 0.0,
            "gpus_with_ofu": self._scalar_or("kernelfleet:fleet_gpus_with_ofu:count", f"count({whole})") or 0.0,
            "mean_ofu_ratio": self._scalar_or("kernelfleet:fleet_gpu_ofu:avg", f"avg({whole})"),
            "achieved_flops": achieved,
            "peak_flops": total_peak,
            "capacity_weighted_ofu_ratio": achieved / total_peak if achieved is not None and total_peak else None,
            "hosts": sorted(self._host_gpus()),
        }

    def overview(self, hosts: Sequence[str], k: int, catalog: Catalog) -> views.Overview:
        """The fleet view from per-host aggregates and two ``bottomk`` queries; GPU rows only for
        the hosts asked for (views.overview is the same from every GPU's rows)."""
        whole = WHOLE_OFU
        counts = self._host_gpus()
        measured = self._by_host("kernelfleet:host_gpus_with_ofu:count", f"count by (hostname) ({whole})")
        stale = self._by_host("kernelfleet:host_stale:count", "sum by (hostname) (kernelfleet_sample_stale)")
        mean = self._by_host("kernelfleet:host_gpu_ofu:avg", f"avg by (hostname) ({whole})")
        worst_of = {s["metric"]["hostname"]: _gpu_ref(s) for s in self._vector_or(
            "kernelfleet:host_worst_gpu_ofu:bottom1", f"bottomk by (hostname) (1, {whole})")}
        recorded = [f"bottomk({int(k)}, kernelfleet:fleet_worst_gpu_ofu:bottom50)"] if k <= WORST_RECORDED else []
        worst = sorted((_gpu_ref(s) for s in self._vector_or(*recorded, f"bottomk({int(k)}, {whole})")),
                       key=lambda g: (g.ofu_ratio, g.label))
        rows = [views.HostRow(host=h, gpus=int(n), gpus_with_ofu=int(measured.get(h, 0)), stale=int(stale.get(h, 0)),
                              mean_ofu_ratio=mean.get(h), worst=worst_of.get(h)) for h, n in sorted(counts.items())]
        skus = {s["metric"].get("sku") for s in self._vector_or("kernelfleet:fleet_gpus_by_sku:count",
                                                                 "count by (sku) (kernelfleet_gpu_info)")}
        return views.Overview(
            hosts=rows, worst=worst,
            gpus=views.labelled(self.gpus(hosts)),
            newest_seconds=self._scalar_or("kernelfleet:fleet_newest_sample:timestamp",
                                           "max(timestamp(kernelfleet_sample_stale))"),
            ofu_note=same_die_note(catalog) if set(SAME_DIE) <= skus else None)

    def gpu_page(self, limit: int, after: gpu_pages.Key | None) -> gpu_pages.GpuPage:
        """A page of GPU rows that reads a few hosts' series, not the whole fleet's: the rows per
        host (one aggregate, a series a host) say which hosts hold the ``limit`` rows after
        ``after``; then :meth:`gpus` of those hosts only."""
        counts = self._by_host(ROWS_BY_HOST)
        pending = sorted(h for h in counts if after is None or h >= after[0])
        rows: list[dict[str, Any]] = []
        while pending and len(rows) <= limit:  # one row past the page says there is a next one
            chosen, wanted = [], limit + 1 - len(rows)
            while pending and wanted > 0:
                chosen.append(host := pending.pop(0))
                # the cursor's host holds rows before the cursor too: how many of its rows are after
                # it is unknown, so it counts for none and the next host is read with it
                wanted -= 0 if after is not None and host == after[0] else counts[host]
            # a page of every host reads the fleet's vectors unfiltered: at 1,000 GPUs a hostname=~ of
            # 125 hosts and a uuid=~ of 1,000 uuids cost Prometheus more than the whole vectors
            hosts = None if len(chosen) == len(counts) else chosen
            rows += [r for r in self.gpus(hosts) if after is None or gpu_pages.key(r) > after]
        return gpu_pages.page(rows, limit, after, total=int(sum(counts.values())), more=bool(pending))

    def gpus(self, hosts: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every GPU's row, or (``hosts``) the rows of those hosts' GPUs only."""
        if hosts is not None and not hosts:
            return []
        on = "" if hosts is None else f'{{hostname=~"{_quote("|".join(_regex(h) for h in hosts))}"}}'
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        fields = {"ofu_ratio": "ofu", "tensor_active_ratio": "tensor_active", "sm_clock_hertz": "sm_clock_hertz",
                  "dram_bandwidth_ratio": "dram_bandwidth", "power_watts": "power_watts",
                  "sm_active_ratio": "sm_active", "sm_occupancy_ratio": "sm_occupancy"}
        # The vectors of a page's rows do not depend on one another: asked at once, Prometheus
        # evaluates them side by side (what a page waits for is its slowest, not their sum)
        queries = [f"timestamp(kernelfleet_sample_stale{on})", f"kernelfleet_gpu_info{on}",
                   f"kernelfleet_sample_stale{on}", *(SERIES[metric] + on for metric in fields.values())]
        with ThreadPoolExecutor(PARALLEL_QUERIES) as pool:
            stamps, infos, stales, *values = pool.map(self._vector, queries)
        # when each GPU's last sample was scraped: the value's own time is the query's, not the sample's
        sampled = {(s["metric"]["uuid"], s["metric"].get("mig", "")): float(s["value"][1]) for s in stamps}
        # the NVML name and the catalog SKU, where the agent exported its kernelfleet_gpu_info
        info = {s["metric"]["uuid"]: s["metric"] for s in infos}
        for s in stales:
            m = s["metric"]
            key = m["uuid"], m.get("mig", "")
            named = info.get(m["uuid"], {})
            rows[key] = {
                "host": m["hostname"], "gpu": int(m["gpu"]), "mig_instance": int(m["mig"]) if m.get("mig") else None,
                "uuid": m["uuid"], "name": named.get("name") or m["model"], "sku": named.get("sku") or m["model"],
                "stale": s["value"][1] == "1", "timestamp_seconds": sampled.get(key, float(s["value"][0])), "jobs": [],
                **{f: None for f in fields},
            }
        for field, answer in zip(fields, values):
            for s in answer:
                row = rows.get((s["metric"]["uuid"], s["metric"].get("mig", "")))
                if row is not None:
                    row[field] = float(s["value"][1])
        # job series carry no hostname: the hosts' GPUs by uuid
        held = "" if hosts is None else f'{{uuid=~"{_quote("|".join(sorted({_regex(u) for u, _ in rows})))}"}}'
        for s in self._vector(f"kernelfleet_job_info{held}") if rows else ():
            m = s["metric"]
            row = rows.get((m["uuid"], m.get("mig", "")))
            if row is not None:
                row["jobs"].append({"job": m["job_id"], "kind": m.get("kind"), "user": m.get("user") or None,
                                    "share": None, "approximate": False, **{k: m.get(k) or None for k in POD_LABELS}})
        for row in rows.values():
            row["bottleneck"] = classify(Sample(
                timestamp_seconds=row["timestamp_seconds"], window_seconds=0.0, gpu_index=row["gpu"], uuid=row["uuid"],
                name=row["name"], stale=row["stale"], tensor_active_ratio=row["tensor_active_ratio"],
                sm_active_ratio=row.pop("sm_active_ratio"), sm_occupancy_ratio=row.pop("sm_occupancy_ratio"),
                dram_bandwidth_ratio=row["dram_bandwidth_ratio"])).value
        return sorted(rows.values(), key=lambda r: (r["host"], r["gpu"], r["mig_instance"] or -1))

    def series(self, uuid: str, start: float, end: float, resolution: str, metrics: list[str],
               limit: int | None = None) -> list[dict[str, Any]]:
        unknown = set(metrics) - set(SERIES)
        if unknown:
            raise UsageError(f"unknown metric(s) {sorted(unknown)}; known: {', '.join(SERIES)}")
        step = step_for(start, end, STEPS[resolution])
        points: dict[float, dict[str, Any]] = {}
        found = False
        for metric in metrics:
            query = f'{SERIES[metric]}{{uuid="{_quote(uuid)}", mig=""}}'
            if step > STEPS["raw"]:  # a point stands for its step: the mean over it, not the sample at its end
                query = f"avg_over_time({query}[{step}s])"
            for s in self._get("/api/v1/query_range", query=query, start=start, end=end, step=step)["result"]:
                found = True
                for ts, value in s["values"]:
                    points.setdefault(float(ts), {"ts": float(ts), **{m: None for m in metrics}})[metric] = float(value)
        if not found and not self._vector(f'kernelfleet_sample_stale{{uuid="{_quote(uuid)}"}}'):
            raise NotFound(f"no GPU with uuid {uuid!r}")
        return [points[t] for t in sorted(points)][:limit]

    def fleet_series(self, start: float, end: float) -> list[dict[str, Any]]:
        """Fleet OFU per step (a minute, or more for a range of over a day): the mean over GPUs of
        each GPU's mean over the step, from the recorded fleet series where there is one."""
        step = step_for(start, end, 60)

        def column(*queries: str) -> dict[float, float]:
            result = self._range_or(start, end, step, *queries)
            return {float(t): float(v) for t, v in (result[0]["values"] if result else [])}

        ofu = column(f"avg_over_time(kernelfleet:fleet_gpu_ofu:avg[{step}s])",
                     f'avg(avg_over_time(kernelfleet_ofu_ratio{{mig=""}}[{step}s]))')
        gpus = column("kernelfleet:fleet_gpus_with_ofu:count", 'count(kernelfleet_ofu_ratio{mig=""})')
        return [{"ts": t, "ofu": v, "gpus": gpus.get(t)} for t, v in sorted(ofu.items())]

    def ofu_grid(self, start: float, end: float, step_seconds: int) -> list[tuple[str, str, int, int | None, int, float | None]]:
        """Every GPU's mean OFU per step, as ``Store.ofu_grid`` gives it: a point at t is the mean
        over the step ending at t, so it is the step starting at t - step."""
        first = (int(start) // step_seconds + 1) * step_seconds
        result = self._get("/api/v1/query_range", query=f'avg_over_time(kernelfleet_ofu_ratio{{mig=""}}[{step_seconds}s])',
                           start=first, end=max(first, end + step_seconds), step=step_seconds)["result"]
        rows = [(m["hostname"], m["uuid"], int(m["gpu"]), None, int(float(t)) - step_seconds, float(v))
                for s in result for m in [s["metric"]] for t, v in s["values"]]
        return sorted(rows, key=lambda r: (r[0], r[2], r[4]))

    def jobs(self, limit: int | None = None) -> list[str]:
        return sorted({s["metric"]["job_id"] for s in self._vector("kernelfleet_job_info")})[:limit]

    def job_summaries(self, since: float, limit: int | None = None) -> list[dict[str, Any]]:
        window = max(60, int(self.clock() - since))
        weighted = f"{SHARE} * on (uuid, mig) group_left () avg_over_time(kernelfleet_ofu_ratio[{window}s])"
        ofu = {s["metric"]["job_id"]: float(s["value"][1]) for s in self._vector_or(
            f"avg_over_time(kernelfleet:job_ofu:avg[{window}s])", f"sum by (job_id) ({weighted}) / sum by (job_id) ({SHARE})")}
        info = {s["metric"]["job_id"]: s["metric"].get("kind") for s in self._vector("kernelfleet_job_info")}
        gpus = {s["metric"]["job_id"]: int(float(s["value"][1])) for s in self._vector_or(
            "kernelfleet:job_gpus:count", "count by (job_id) (kernelfleet_job_info)")}
        rows = [{"job": j, "kind": info.get(j), "gpus": gpus.get(j, 0), "ofu_ratio": v} for j, v in ofu.items() if j in info]
        return sorted(rows, key=lambda r: r["ofu_ratio"])[:limit]

    def job(self, job: str) -> dict[str, Any]:
        selector = f'kernelfleet_job_info{{job_id="{_quote(job)}"}}'
        holds = [s["metric"] for s in self._vector(selector)]
        if not holds:
            raise NotFound(f"no job {job!r} in Prometheus (kernelfleet_job_info)")
        # a day of the job's GPUs only, not of every GPU in the fleet before the join drops them
        uuids = "|".join(sorted({_regex(h["uuid"]) for h in holds}))
        per_gpu = self._vector(f'avg_over_time(kernelfleet_ofu_ratio{{uuid=~"{_quote(uuids)}"}}[24h]) '
                               f"* on (uuid, mig) group_left () {selector}")
        now = self.clock()
        step = step_for(now - 86400, now, 60)
        timeline = self._range_or(
            now - 86400, now, step, f'avg_over_time(kernelfleet:job_ofu:avg{{job_id="{_quote(job)}"}}[{step}s])',
            f"avg(kernelfleet_ofu_ratio * on (uuid, mig) group_left () {selector})")
        points = [{"ts": float(t), "ofu_ratio": float(v)} for t, v in (timeline[0]["values"] if timeline else [])]
        # what the store's report also has (kernelfleet/fleet/report.py reads it): the minutes each GPU
        # reported over the day, its share now, and the minutes its GPUs spent in each bottleneck class
        mix = self._vector(f'sum by (class) (count_over_time((max by (uuid, mig, class) (kernelfleet_bottleneck_class'
                           f'{{uuid=~"{_quote(uuids)}"}}))[24h:1m])) * 60')
        seconds = self._by_gpu(f"count_over_time(avg_over_time(kernelfleet_ofu_ratio{{uuid=~\"{_quote(uuids)}\"}}[1m])"
                               "[24h:1m]) * 60")
        share = self._by_gpu(f'{SHARE}{{job_id="{_quote(job)}"}}')
        return {
            "job": job, "kind": holds[0].get("kind"), "user": holds[0].get("user") or None,
            "first_seen": points[0]["ts"] if points else now, "last_seen": points[-1]["ts"] if points else now,
            "gpus": [{"host": m["hostname"], "uuid": m["uuid"], "gpu_index": int(m["gpu"]),
                      "mig_instance": int(m["mig"]) if m.get("mig") else None, "name": m["model"],
                      "ofu_ratio": float(s["value"][1]), "seconds": seconds.get(_key(m), 0.0),
                      "mean_share": share.get(_key(m), 1.0), "approximate": False}
                     for s in per_gpu for m in [s["metric"]]],
            "bottleneck_seconds": {s["metric"]["class"]: float(s["value"][1]) for s in mix if s["metric"].get("class")},
            "timeline_1m": points,
            "events": [e for e in self.events(now - 86400) if e["job"] == job],
        }

    def job_seconds_below(self, job: str, ofu_ratio: float) -> dict[tuple[str, int | None], float]:
        """Per GPU the job holds now: the seconds of its last day's minutes whose mean OFU was below
        ``ofu_ratio`` (minutes as a 1-minute subquery samples them; the job's share is not applied)."""
        holds = {_key(s["metric"]) for s in self._vector(f'kernelfleet_job_info{{job_id="{_quote(job)}"}}')}
        uuids = "|".join(sorted({_regex(uuid) for uuid, _ in holds}))
        below = self._by_gpu(f'count_over_time((avg_over_time(kernelfleet_ofu_ratio{{uuid=~"{_quote(uuids)}"}}[1m]) '
                             f"< {float(ofu_ratio)!r})[24h:1m]) * 60") if holds else {}
        return {key: value for key, value in below.items() if key in holds}

    def _by_gpu(self, query: str) -> dict[tuple[str, int | None], float]:
        return {_key(s["metric"]): float(s["value"][1]) for s in self._vector(query)}

    def hook(self, report: dict[str, Any]) -> dict[str, Any]:
        raise NotFound("hook reports go to the agent on the job's node, not to the fleet dashboard")

    def events(self, since: float, limit: int | None = None) -> list[dict[str, Any]]:
        out = []
        for alert in self._get("/api/v1/alerts")["alerts"]:
            # pending is a condition not yet held for the rule's `for:`: no regression yet
            if not alert["labels"].get("alertname", "").startswith("Kernelfleet") or alert.get("state") != "firing":
                continue
            ts = _rfc3339(alert.get("activeAt"))
            if ts is not None and ts >= since:
                out.append({"ts": ts, "kind": alert["labels"]["alertname"], "uuid": alert["labels"].get("uuid"),
                            "job": alert["labels"].get("job_id"),
                            "detail": alert.get("annotations", {}).get("summary", alert["labels"]["alertname"])})
        return sorted(out, key=lambda e: e["ts"])[-limit if limit else None:]


def _gpu_ref(s: dict[str, Any]) -> views.GpuRef:
    """A whole GPU's series as the page names it."""
    m = s["metric"]
    return views.GpuRef(uuid=m["uuid"], label=views.gpu_label(m["hostname"], int(m["gpu"]), None),
                        ofu_ratio=float(s["value"][1]))


def _key(labels: dict[str, str]) -> tuple[str, int | None]:
    """A GPU's (uuid, MIG instance) from its series' labels."""
    return labels["uuid"], int(labels["mig"]) if labels.get("mig") else None


def step_for(start: float, end: float, base: int) -> int:
    """The smallest multiple of ``base`` seconds that draws [start, end] in at most MAX_POINTS points."""
    return base * max(1, math.ceil((end - start) / base / MAX_POINTS))


def _regex(value: str) -> str:
    """``value`` matched literally in a PromQL (RE2) regular expression."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", value)


def _quote(value: str) -> str:
    """A PromQL string literal's inside: backslashes and quotes escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _rfc3339(text: str | None) -> float | None:
    """Prometheus's RFC 3339 times carry nanoseconds; datetime takes microseconds."""
    if not text:
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()
