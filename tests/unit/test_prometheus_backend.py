"""The fleet dashboard's Prometheus backend on answers in Prometheus's own JSON (as its HTTP API
gives them): firing alerts only, the samples' own times, NVML names, the step a range draws, and
the recorded series first with the raw series behind them. tests/e2e runs it on a real server."""

import urllib.parse

import pytest

from kernelfleet.fleet.prometheus_backend import MAX_POINTS, PrometheusBackend, step_for

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0
GPU = {"gpu": "0", "uuid": "GPU-a", "model": "h200-sxm", "hostname": "node-1", "mig": ""}


class Answers:
    """Prometheus's answers by query; every query asked is kept in ``asked``."""

    def __init__(self, vectors: dict[str, list], ranges: dict[str, list] | None = None, alerts: list | None = None):
        self.vectors, self.ranges, self.alerts, self.asked = vectors, ranges or {}, alerts or [], []
        self.times: list[str | None] = []  # each request's time= parameter (None: Prometheus's own now)

    def __call__(self, url: str) -> dict:
        path, _, query = url.partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        self.times.append(params.get("time"))
        self.asked.append((path.rsplit("/", 1)[-1], params.get("query"), params.get("step")))
        if path.endswith("/alerts"):
            return {"status": "success", "data": {"alerts": self.alerts}}
        table = self.ranges if path.endswith("query_range") else self.vectors
        return {"status": "success", "data": {"result": table.get(params["query"], [])}}


def test_only_firing_alerts_are_regressions():
    alerts = [{"labels": {"alertname": "KernelfleetOfuRegression", "job_id": "a"}, "state": "pending",
               "activeAt": "2027-01-15T08:00:00.123456789Z", "annotations": {"summary": "pending"}},
              {"labels": {"alertname": "KernelfleetOfuRegression", "job_id": "b"}, "state": "firing",
               "activeAt": "2027-01-15T08:00:00.5Z", "annotations": {"summary": "b fell"}},
              {"labels": {"alertname": "Other"}, "state": "firing", "activeAt": "2027-01-15T08:00:00Z"}]
    backend = PrometheusBackend("http://prom:9090", fetch=Answers({}, alerts=alerts), clock=lambda: NOW)
    (event,) = backend.events(0)
    assert (event["job"], event["detail"], event["ts"]) == ("b", "b fell", 1800000000.5)


def test_gpus_carry_their_samples_time_and_nvml_name():
    answers = Answers({
        "kernelfleet_sample_stale": [{"metric": GPU, "value": [NOW, "0"]}],
        "timestamp(kernelfleet_sample_stale)": [{"metric": GPU, "value": [NOW, str(NOW - 12.5)]}],
        "kernelfleet_gpu_info": [{"metric": {"uuid": "GPU-a", "name": "NVIDIA H200", "sku": "h200-sxm"},
                                  "value": [NOW, "1"]}],
    })
    (gpu,) = PrometheusBackend("http://prom:9090", fetch=answers, clock=lambda: NOW).gpus()
    assert (gpu["name"], gpu["sku"], gpu["timestamp_seconds"]) == ("NVIDIA H200", "h200-sxm", NOW - 12.5)


def test_a_gpu_without_info_keeps_its_model_label():
    answers = Answers({"kernelfleet_sample_stale": [{"metric": GPU, "value": [NOW, "1"]}]})
    (gpu,) = PrometheusBackend("http://prom:9090", fetch=answers, clock=lambda: NOW).gpus()
    assert (gpu["name"], gpu["stale"], gpu["timestamp_seconds"]) == ("h200-sxm", True, NOW)


def test_instant_queries_run_at_the_backends_clock_not_prometheus_now():
    answers = Answers({"kernelfleet:fleet_gpus:count": [{"metric": {}, "value": [NOW - 7200, "3"]}]})
    backend = PrometheusBackend("http://p", fetch=answers, clock=lambda: NOW - 7200)
    backend.fleet()
    backend.gpus()
    assert answers.times and set(answers.times) == {str(NOW - 7200)}


def test_the_step_grows_with_the_range_so_a_chart_gets_at_most_max_points():
    assert step_for(NOW - 900, NOW, 15) == 15  # the dashboard's 15 minutes: every scrape
    assert step_for(NOW - 86400, NOW, 60) == 60
    assert step_for(NOW - 30 * 86400, NOW, 60) == 1800
    for days in (1, 7, 30, 400):
        step = step_for(0, days * 86400, 60)
        assert step % 60 == 0 and days * 86400 / step <= MAX_POINTS


def test_the_fleet_line_reads_the_recorded_series_and_falls_back_to_the_raw_one():
    rule = "avg_over_time(kernelfleet:fleet_gpu_ofu:avg[60s])"
    raw = 'avg(avg_over_time(kernelfleet_ofu_ratio{mig=""}[60s]))'
    count_rule, count_raw = "kernelfleet:fleet_gpus_with_ofu:count", 'count(kernelfleet_ofu_ratio{mig=""})'
    recorded = Answers({}, ranges={rule: [{"metric": {}, "values": [[NOW, "0.5"]]}],
                                   count_rule: [{"metric": {}, "values": [[NOW, "3"]]}]})
    assert PrometheusBackend("http://p", fetch=recorded).fleet_series(NOW - 3600, NOW) == [
        {"ts": NOW, "ofu": 0.5, "gpus": 3.0}]
    assert raw not in {q for _, q, _ in recorded.asked}  # the rule answered: the raw series was never read
    bare = Answers({}, ranges={raw: [{"metric": {}, "values": [[NOW, "0.25"]]}],
                               count_raw: [{"metric": {}, "values": [[NOW, "2"]]}]})
    assert PrometheusBackend("http://p", fetch=bare).fleet_series(NOW - 3600, NOW) == [
        {"ts": NOW, "ofu": 0.25, "gpus": 2.0}]
    assert [q for _, q, _ in bare.asked] == [rule, raw, count_rule, count_raw]


def test_a_jobs_day_reads_only_its_gpus_and_its_recorded_line():
    held = {"uuid": "GPU-a.1", "mig": "", "job_id": "train", "kind": "slurm", "user": "ana"}
    answers = Answers({'kernelfleet_job_info{job_id="train"}': [{"metric": held, "value": [NOW, "1"]}]})
    PrometheusBackend("http://p", fetch=answers, clock=lambda: NOW).job("train")
    queries = [q for _, q, _ in answers.asked]
    assert any(q.startswith('avg_over_time(kernelfleet_ofu_ratio{uuid=~"GPU-a\\\\.1"}[24h])') for q in queries)
    assert 'avg_over_time(kernelfleet:job_ofu:avg{job_id="train"}[60s])' in queries


def test_a_jobs_bottleneck_mix_is_its_gpus_minutes_by_class():
    held = {"uuid": "GPU-a", "mig": "", "job_id": "train", "kind": "slurm", "user": "ana"}
    mix = ('sum by (class) (count_over_time((max by (uuid, mig, class) (kernelfleet_bottleneck_class{uuid=~"GPU-a"}))'
           "[24h:1m])) * 60")
    answers = Answers({'kernelfleet_job_info{job_id="train"}': [{"metric": held, "value": [NOW, "1"]}],
                       mix: [{"metric": {"class": "tensor-bound"}, "value": [NOW, "3000"]},
                             {"metric": {"class": "memory-bound"}, "value": [NOW, "600"]}]})
    found = PrometheusBackend("http://p", fetch=answers, clock=lambda: NOW).job("train")
    assert found["bottleneck_seconds"] == {"tensor-bound": 3000.0, "memory-bound": 600.0}


def test_the_fleet_card_and_the_hosts_table_read_aggregates_never_every_gpu():
    """At 10,000 GPUs an instant vector of every GPU is seconds of PromQL a refresh: the fleet card
    and the hosts table read the dashboard group's recorded series (or their per-host aggregates),
    the worst GPUs two bottomk queries, and GPU rows only for the hosts that are open."""
    from kernelfleet.catalog import Catalog

    host = lambda h, v: {"metric": {"hostname": h}, "value": [NOW, str(v)]}
    gpu = lambda h, i, v: {"metric": {**GPU, "hostname": h, "gpu": str(i), "uuid": f"GPU-{h}-{i}"},
                           "value": [NOW, str(v)]}
    answers = Answers({
        "kernelfleet:fleet_gpus:count": [{"metric": {}, "value": [NOW, "16"]}],
        "kernelfleet:fleet_gpu_ofu:avg": [{"metric": {}, "value": [NOW, "0.4"]}],
        "kernelfleet:host_gpus:count": [host("n1", 8), host("n2", 8)],
        "kernelfleet:host_gpu_ofu:avg": [host("n1", 0.5), host("n2", 0.3)],
        # no kernelfleet:host_stale:count rule here: the raw aggregate answers
        "sum by (hostname) (kernelfleet_sample_stale)": [host("n1", 0), host("n2", 2)],
        'bottomk by (hostname) (1, kernelfleet_ofu_ratio{mig=""})': [gpu("n1", 3, 0.2), gpu("n2", 5, 0.1)],
        "bottomk(2, kernelfleet:fleet_worst_gpu_ofu:bottom50)": [gpu("n1", 3, 0.2), gpu("n2", 5, 0.1)],
        'kernelfleet_sample_stale{hostname=~"n2"}': [gpu("n2", 5, 0)],
    })
    backend = PrometheusBackend("http://p", fetch=answers, clock=lambda: NOW)
    assert backend.fleet()["gpus"] == 16 and backend.fleet()["hosts"] == ["n1", "n2"]
    shut = backend.overview([], 2, Catalog.load())
    assert [(h.host, h.gpus, h.stale, h.mean_ofu_ratio, h.worst.label) for h in shut.hosts] == [
        ("n1", 8, 0, 0.5, "n1 / GPU 3"), ("n2", 8, 2, 0.3, "n2 / GPU 5")]
    assert [w.label for w in shut.worst] == ["n2 / GPU 5", "n1 / GPU 3"] and shut.gpus == []
    every_gpu = {"kernelfleet_sample_stale", "kernelfleet_ofu_ratio", "kernelfleet_gpu_info", "kernelfleet_job_info",
                 "timestamp(kernelfleet_sample_stale)"}
    assert not every_gpu & {q for _, q, _ in answers.asked}
    opened = backend.overview(["n2"], 2, Catalog.load())
    assert [g["label"] for g in opened.gpus] == ["n2 / GPU 5"]
    assert not every_gpu & {q for _, q, _ in answers.asked}  # even the open host's rows are filtered
