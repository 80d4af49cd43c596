"""deploy/grafana/kernelfleet-serve.json and rules.yml's serving groups, against a real server.

Static checks: each query selects only series ``kernelfleet serve`` exposes or rules.yml records,
every variable it uses is defined, every panel follows the Server filter, and panels do not overlap.
Then a real ``kernelfleet serve --cpu`` (a tiny Llama) is scraped by a real Prometheus that loads
rules.yml, as scrape.yml's kernelfleet-serve job does; requests are sent, some streamed, and more
at once than its queue holds (so some get 429): every panel query, with Grafana's variables filled
in, must parse, return data, and return nothing once the Server filter matches no server.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    BUILTIN_VARIABLE,
    assert_panels_tile_the_grid,
    dashboard_targets,
    dashboard_variables,
    grafana_expr,
    promql_metric_names,
    query,
    recorded_names,
    serve_metric_names,
    start_prometheus,
    until,
    used_variables,
    variable_query,
)
from recorded import ServeCommand, tiny_causal_lm

pytestmark = pytest.mark.e2e

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kernelfleet-serve.json"
SERVER = 'instance=~"$server"'
IDLE_ZERO = re.compile(r"kernelfleet_serve_requests_(waiting|running)\b")


def board() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_every_query_selects_only_served_or_recorded_series():
    known = serve_metric_names() | recorded_names()
    for where, _, target in dashboard_targets(board()):
        used = promql_metric_names(target["expr"])
        assert used, f"{where}: no metric in {target['expr']!r}"
        assert used <= known, f"{where}: {sorted(used - known)} is neither served nor recorded"
    (server,) = [v for v in dashboard_variables(board()).values() if v["type"] == "query"]
    selector = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable_query(server))
    assert selector and promql_metric_names(selector.group(1)) <= known and selector.group(2) == "instance"


def test_every_variable_used_is_defined_and_every_panel_follows_the_server_filter():
    defined = dashboard_variables(board())
    used = {name for name in used_variables(json.dumps(board()["panels"])) if not BUILTIN_VARIABLE.fullmatch(name)}
    assert used == defined.keys(), f"used {sorted(used)}, defined {sorted(defined)}"
    assert defined["server"]["includeAll"] and defined["server"]["allValue"] == ".*"
    for where, panel, target in dashboard_targets(board()):
        assert panel["datasource"] == target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert SERVER in target["expr"], f"{where}: ignores the Server filter: {target['expr']}"


def test_panels_have_unique_ids_and_do_not_overlap_on_the_grid():
    assert board()["uid"] == "kernelfleet-serve" and board()["schemaVersion"] >= 39
    assert_panels_tile_the_grid(board())


async def load(url: str) -> list[int]:
    """Requests as clients send them: a few one after another (one streamed), then a burst larger
    than the server's slots and queue, twice, seconds apart (so scrapes fall between them: a rate
    needs two samples that differ); the status of each request of the bursts."""
    body = {"prompt": [5, 9, 100, 3], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    codes = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for wave in range(2):
            for stream in (False, True, False):
                answer = await client.post("/v1/completions", json={**body, "stream": stream})
                assert answer.status_code == 200, answer.text
            burst = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(8)))
            codes += [a.status_code for a in burst]
            if not wave:
                await asyncio.sleep(3)  # three scrapes at 1 s
    return codes


def test_every_panel_has_data_from_a_real_server_and_obeys_the_server_filter(tmp_path):
    tiny_causal_lm("llama", seed=3).save_pretrained(tmp_path / "llama")
    with ServeCommand(f"hf:{tmp_path / 'llama'}", "--cpu", "--slots", "1", "--max-queue", "1",
                      "--context", "64") as server:
        prom, base = start_prometheus(tmp_path, int(server.url.rsplit(":", 1)[1]), "1s", job="kernelfleet-serve")
        try:  # a first scrape before any request, so the counters' rates see the requests
            until(lambda: query(base, 'up{job="kernelfleet-serve"} == 1', True), "Prometheus never scraped the server")
            codes = asyncio.run(load(server.url))
            assert 429 in codes and 200 in codes, codes  # the queue overflowed, and the queue was served
            until(lambda: query(base, "kernelfleet_serve:time_per_output_token_seconds:p99_1m > 0", True)
                  and query(base, "kernelfleet_serve:device_busy:ratio1m > 0", True)
                  and query(base, "kernelfleet_serve:requests:rate1m > 0", True),
                  "the serving rules never recorded a value", timeout=90)
            (instance,) = {r["metric"]["instance"] for r in query(base, "kernelfleet_serve_queue_limit_requests", True)}
            assert instance == server.url.removeprefix("http://")
            for where, _, target in dashboard_targets(board()):
                got = query(base, grafana_expr(target["expr"], {"server": ".*"}), False)
                values = [float(v) for r in got for _, v in r["values"]]
                assert values, f"{where}: no data: {target['expr']}"
                # requests in a slot or queued read 0 between requests; a scrape may miss the burst
                assert max(values) > 0 or IDLE_ZERO.search(target["expr"]), f"{where}: only zeros: {target['expr']}"
                narrowed = query(base, grafana_expr(target["expr"], {"server": "no-such-server"}), False)
                assert all(not r["metric"] for r in narrowed), f"{where}: ignores the Server filter"
        finally:
            prom.terminate()
            prom.wait(timeout=30)
    assert server.returncode == 0, server.err
