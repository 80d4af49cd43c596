"""deploy/grafana/kernelfleet.json reads well at hundreds of GPUs and every query is one Prometheus runs.

Static checks: each query selects only series the exporter defines or rules.yml records (both read
from the code and the rules, not listed here), every variable it uses is defined, every panel
follows the Cluster, Host, Model and Job filters, and no panel draws one line per GPU without a
top-k bound. Then a real agent (the bundled H200 recording) is scraped by a real Prometheus that
loads rules.yml and adds a ``cluster`` target label, as docs/fleet.md tells operators to: every
panel query, with Grafana's variables filled in, is sent to /api/v1/query(_range); it must parse,
return data where the recording has some, and return nothing once any one filter matches no GPU.
At fleet size, 800 GPUs written by the real collector: every panel but the heatmap returns at most k
series, the heatmap one row per GPU sorted by host, and the worst and best k are the right GPUs.
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from e2e_helpers import (
    BUILTIN_VARIABLE,
    RANGE_SECONDS,
    assert_panels_tile_the_grid,
    dashboard_targets,
    dashboard_variables,
    exporter_metric_names,
    free_port,
    grafana_expr,
    panels,
    promql_metric_names,
    query,
    recorded_names,
    start_prometheus,
    used_variables,
    variable_query,
    wait_http,
)
from prometheus_client import CollectorRegistry, generate_latest

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.reading import JobShare, Reading
from kernelfleet.ofu import classify, ofu
from kernelfleet.telemetry.sample import Sample

pytestmark = pytest.mark.e2e

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kernelfleet.json"
FILTERS = {"cluster": 'cluster=~"$cluster"', "hostname": 'hostname=~"$hostname"', "model": 'model=~"$model"',
           "job": 'job_id=~"$job"'}
# Queries the bundled recording leaves empty: it has no stale window, and it predates temperature and
# clock-event reasons (the exporter leaves out what a GPU lacks, never exports 0).
EMPTY_ON_THE_RECORDING = {"Stale GPUs A", "Stale GPUs B", "Clocks held down: GPUs per reason A", "Hottest $k GPUs A"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def targets() -> list[tuple[str, dict, dict]]:
    return dashboard_targets(dashboard())


def variables() -> dict[str, dict]:
    return dashboard_variables(dashboard())


def test_every_query_selects_only_exported_or_recorded_series():
    known = exporter_metric_names() | recorded_names()
    queries = [(f"variable {v['name']}", variable_query(v)) for v in variables().values() if v["type"] == "query"]
    queries += [(where, t["expr"]) for where, _, t in targets()]
    for where, expr in queries:
        if where.startswith("variable"):
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", expr)
            assert m, f"{where}: {expr!r} is not label_values(selector, label)"
            expr = m.group(1)
        used = promql_metric_names(expr)
        assert used, f"{where}: no metric in {expr!r}"
        assert used <= known, f"{where}: {sorted(used - known)} is neither exported nor recorded"


def test_every_variable_used_is_defined_and_every_defined_one_is_used():
    defined = variables()
    text = json.dumps({k: v for k, v in dashboard().items() if k != "templating"})
    text += " ".join(variable_query(v) for v in defined.values() if v["type"] == "query")
    used = {name for name in used_variables(text) if not BUILTIN_VARIABLE.fullmatch(name)}
    assert used <= defined.keys(), f"used but not defined: {sorted(used - defined.keys())}"
    assert defined.keys() - {"datasource"} <= used, f"defined but never used: {sorted(defined.keys() - used)}"
    assert defined["datasource"]["type"] == "datasource" and defined["datasource"]["query"] == "prometheus"
    for name in ("cluster", "hostname", "model", "job"):
        var = defined[name]
        assert var["includeAll"] and var["allValue"] == ".*", f"{name}: All must match series without the label"
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable_query(defined["job"])).group(2)
    assert label == "job_id", "the workload's label is job_id (job is the scrape job)"


def test_used_variables_reads_both_spellings():
    assert used_variables('x{a=~"$host"} ${k} ${__field.labels.instance} ${var:regex} $1') == {
        "host", "k", "__field", "var", "1"}


def test_every_panel_follows_every_filter():
    for where, panel, target in targets():
        assert panel["datasource"] == target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        missing = [name for name, matcher in FILTERS.items() if matcher not in target["expr"]]
        assert not missing, f"{where}: ignores the {missing} filter(s): {target['expr']}"


def test_no_panel_draws_a_line_per_gpu_without_a_k_bound():
    """At 800 GPUs a raw per-GPU selector is 800 lines: aggregate it, bound it by topk/bottomk, or heatmap it."""
    kinds = {p["type"] for p in panels(dashboard()["panels"])}
    assert "heatmap" in kinds
    exprs = [t["expr"] for _, _, t in targets()]
    assert any("bottomk($k," in e for e in exprs) and any("topk($k," in e for e in exprs)
    aggregated = re.compile(r"^\s*(\d[\d.]*\s*\*\s*)?(sum|avg|min|max|count|quantile)\b.*\(|.*\b(top|bottom)k\(\$k,")
    for where, panel, target in targets():
        if panel["type"] in ("heatmap", "stat") or target.get("instant"):
            continue
        assert aggregated.match(target["expr"]), f"{where}: one line per GPU, unbounded: {target['expr']}"


def test_panels_have_unique_ids_and_do_not_overlap_on_the_grid():
    board = dashboard()
    assert board["uid"] == "kernelfleet-ofu" and board["schemaVersion"] >= 39  # links and bookmarks keep the uid
    assert_panels_tile_the_grid(board)


def test_links_open_the_agent_and_the_kernelfleet_dashboard():
    board = dashboard()
    (link,) = board["links"]
    assert link["url"] == "${kernelfleet_dashboard}"
    assert variables()["kernelfleet_dashboard"]["type"] == "textbox"
    per_gpu = [p for p in panels(board["panels"]) if p["type"] in ("table", "timeseries")
               and any("hostname" in t["legendFormat"] or t.get("format") == "table" for t in p["targets"])]
    assert per_gpu
    for panel in per_gpu:
        (agent,) = panel["fieldConfig"]["defaults"]["links"]
        assert re.fullmatch(r"http://\$\{__(field\.labels|data\.fields)\.instance\}/", agent["url"]), panel["title"]


# --------------------------------------------------------------------------
# Against a real Prometheus
# --------------------------------------------------------------------------


def promql_regex(value: str) -> str:
    """``value`` as a regex inside a PromQL string, escaped as Grafana escapes a variable's value."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def test_promql_regex_escapes_for_a_promql_string():
    assert promql_regex("a.b-c(d)") == "a\\\\.b-c\\\\(d\\\\)"


def test_grafana_expr_fills_variables_and_keeps_capture_groups():
    assert grafana_expr('bottomk($k, x{a=~"$hostname"}[$__range]) "$1"', {"k": "5", "hostname": ".*"}) == \
        f'bottomk(5, x{{a=~".*"}}[{RANGE_SECONDS}s]) "$1"'


def wait_for_recording_rules(base: str) -> None:
    deadline = time.monotonic() + 90
    while not all(query(base, q, True) for q in ("kernelfleet:job_ofu:avg", "kernelfleet:gpu_achieved_bf16_flops")):
        assert time.monotonic() < deadline, "the recording rules never produced a value"
        time.sleep(1)


@pytest.fixture
def prometheus_with_rules(tmp_path):
    """A real agent on the bundled recording, scraped every second."""
    agent_port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet", "agent", "--demo", "--speed", "4", "--store", str(tmp_path / "kf.db"),
         "--listen", f"127.0.0.1:{agent_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = None
    try:
        wait_http(f"http://127.0.0.1:{agent_port}/healthz")
        prom, base = start_prometheus(tmp_path, agent_port, "1s", labels="{cluster: test-a}")
        yield base
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        agent.kill()
        agent.wait(timeout=10)


def _only_the_zero_fallback(result: list[dict]) -> bool:
    """Nothing but ``or vector(0)``'s unlabelled zero."""
    values = [v for r in result for v in ([r["value"]] if "value" in r else r["values"])]
    return all(not r["metric"] for r in result) and all(float(v[1]) == 0.0 for v in values)


def test_every_query_runs_returns_data_and_obeys_each_filter(prometheus_with_rules):
    base = prometheus_with_rules
    everything = {"cluster": ".*", "hostname": ".*", "model": ".*", "job": ".*", "k": "5"}
    wait_for_recording_rules(base)
    (gpu,) = query(base, "kernelfleet_gpu_info", True)
    (job,) = query(base, "kernelfleet_job_info", True)
    (stale,) = query(base, "kernelfleet_sample_stale", True)
    assert gpu["metric"]["cluster"] == "test-a"
    chosen = {**everything, "cluster": "test-a", "hostname": promql_regex(gpu["metric"]["hostname"]),
              "model": promql_regex(stale["metric"]["model"]), "job": f"({promql_regex(job['metric']['job_id'])}|other)"}
    for where, _, target in targets():
        instant = bool(target.get("instant"))
        for values in (everything, chosen):
            result = query(base, grafana_expr(target["expr"], values), instant)
            if where not in EMPTY_ON_THE_RECORDING:
                assert result and not _only_the_zero_fallback(result), f"{where}: no data: {target['expr']}"
        for name in FILTERS:
            result = query(base, grafana_expr(target["expr"], {**chosen, name: "no-such-" + name}), instant)
            assert _only_the_zero_fallback(result), f"{where}: {name}=no-such-{name} still shows {result[:1]}"
    # The heatmap has one row per GPU, named host/gpu (the row label only, so rows sort by host).
    (heatmap,) = [t for _, p, t in targets() if p["type"] == "heatmap"]
    rows = query(base, grafana_expr(heatmap["expr"], everything), False)
    assert [r["metric"] for r in rows] == [{"row": f"{gpu['metric']['hostname']}/{gpu['metric']['gpu']}"}]
    # The variables' own queries list what the recording has.
    for name, var in variables().items():
        if var["type"] != "query":
            continue
        selector = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable_query(var))
        series = query(base, grafana_expr(selector.group(1), everything), True)
        assert {s["metric"].get(selector.group(2)) for s in series} - {None}, f"variable {name} lists nothing"


# --------------------------------------------------------------------------
# At fleet size: 800 GPUs (100 hosts x 8) through the real collector
# --------------------------------------------------------------------------

HOSTS, GPUS_PER_HOST, HOSTS_WITH_A_JOB = 100, 8, 90


def fleet_readings() -> list[Reading]:
    """800 H200s with distinct OFUs spread over the hosts; each of the first 90 hosts runs one job, the last
    10 hosts' GPUs are free (Job = All must still show them)."""
    sku = Catalog.load().lookup("NVIDIA H200", None)
    out = []
    for i in range(HOSTS * GPUS_PER_HOST):
        host = i // GPUS_PER_HOST
        s = Sample(timestamp_seconds=time.time(), window_seconds=1.0, gpu_index=i % GPUS_PER_HOST,
                   uuid=f"GPU-{i:05d}", name="NVIDIA H200", tensor_active_ratio=0.05 + 0.9 * ((i * 37) % 800) / 800,
                   sm_active_ratio=0.9, sm_occupancy_ratio=0.3, dram_bandwidth_ratio=0.2, sm_clock_mean_hertz=1.98e9,
                   power_mean_watts=600.0, temperature_celsius=40.0 + i % 40)
        jobs = (JobShare(f"job-{host:03d}", "slurm", "ana", 1.0, False),) if host < HOSTS_WITH_A_JOB else ()
        out.append(Reading(f"node-{host:03d}", s, sku, ofu(s, sku), classify(s).value, jobs))
    return out


@pytest.fixture
def fleet_prometheus(tmp_path):
    """A real Prometheus scraping the 800 GPUs' /metrics, as the exporter writes it, every 2 s."""
    registry = CollectorRegistry(auto_describe=False)
    readings = fleet_readings()
    registry.register(OfuCollector(lambda: readings))

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # Prometheus scrapes every 2 s: keep the test's output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    prom = None
    try:
        prom, base = start_prometheus(tmp_path, server.server_address[1], "2s", labels="{cluster: test-a}")
        yield base, readings
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        server.shutdown()


def test_at_800_gpus_panels_draw_k_lines_and_the_heatmap_one_row_per_gpu(fleet_prometheus):
    base, readings = fleet_prometheus
    wait_for_recording_rules(base)
    k = 10
    everything = {"cluster": ".*", "hostname": ".*", "model": ".*", "job": ".*", "k": str(k)}
    by_title = {}
    for where, panel, target in targets():
        result = query(base, grafana_expr(target["expr"], everything), bool(target.get("instant")))
        by_title[where] = result
        if panel["type"] == "heatmap":
            rows = [r["metric"]["row"] for r in result]
            assert len(rows) == HOSTS * GPUS_PER_HOST and rows == sorted(rows), f"{where}: {len(rows)} rows"
            assert rows[:2] == ["node-000/0", "node-000/1"]
        else:
            assert len(result) <= k, f"{where}: {len(result)} series at {HOSTS * GPUS_PER_HOST} GPUs"
    # The worst and best k are the k lowest and highest OFUs of the 800, free GPUs included.
    ranked = sorted(readings, key=lambda r: r.ofu.ofu_ratio)
    worst = by_title["Worst $k GPUs by mean OFU over the time range A"]
    assert {r["metric"]["uuid"] for r in worst} == {r.sample.uuid for r in ranked[:k]}
    best = by_title["Best $k GPUs by mean OFU over the time range A"]
    assert {r["metric"]["uuid"] for r in best} == {r.sample.uuid for r in ranked[-k:]}
    assert {r["metric"]["uuid"] for r in by_title["OFU of the worst $k GPUs A"]} == {r.sample.uuid for r in ranked[:k]}
    (count,) = by_title["GPUs reporting OFU A"]
    assert float(count["values"][-1][1]) == HOSTS * GPUS_PER_HOST
    # One job selected: the GPU panels show its host's 8 GPUs; one host: that host's 8.
    (heatmap,) = [t for _, p, t in targets() if p["type"] == "heatmap"]
    for narrowed, host in (({"job": "job-007"}, "node-007"), ({"hostname": "node-095"}, "node-095")):
        rows = [r["metric"]["row"] for r in query(base, grafana_expr(heatmap["expr"], {**everything, **narrowed}), False)]
        assert rows == [f"{host}/{g}" for g in range(GPUS_PER_HOST)], narrowed
