"""The same dashboard served by ``kernelfleet dashboard --prometheus``: a real Prometheus scrapes the
8-GPU synthetic fleet's agent every second, and a real Chromium reads the page its backend feeds."""

import json
import subprocess
import urllib.parse
import urllib.request

import pytest
from e2e_helpers import Browser, SyntheticFleet, binary, free_port, until, wait_http

from kernelfleet.fleet.listener import Listener, bind
from kernelfleet.fleet.prometheus_backend import PrometheusBackend
from kernelfleet.fleet.report import job_report
from kernelfleet.fleet.server import create_app

pytestmark = pytest.mark.e2e

LIVE = "document.getElementById('status').textContent.startsWith('updated')"


@pytest.fixture
def fleet_dashboard(tmp_path):
    """The fleet, Prometheus scraping it, and the Prometheus-backed dashboard; yields both URLs."""
    fleet = SyntheticFleet(tmp_path, hosts=2, per_host=4)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: kernelfleet\n"
                      f"    static_configs:\n      - targets: ['127.0.0.1:{fleet.port}']\n")
    prometheus = subprocess.Popen([binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    dash_port = free_port()
    server = None
    try:
        wait_http(f"{url}/-/ready", timeout=60)
        query = urllib.parse.urlencode({"query": 'count(kernelfleet_ofu_ratio{mig=""})'})
        until(lambda: json.load(urllib.request.urlopen(f"{url}/api/v1/query?{query}"))["data"]["result"],
                     "Prometheus never scraped the fleet")
        server = Listener(create_app(PrometheusBackend(url)), bind("127.0.0.1", dash_port)).start()
        yield url, f"http://127.0.0.1:{dash_port}/"
    finally:
        if server is not None:
            server.stop()
        prometheus.terminate()
        prometheus.wait(timeout=30)
        fleet.close()


def test_the_prometheus_backed_dashboard_shows_hosts_heatmap_and_a_job(fleet_dashboard, tmp_path):
    prometheus, page = fleet_dashboard
    browser = Browser(tmp_path / "chromium")
    try:
        browser.goto(page)
        browser.wait_for(LIVE)
        assert browser.js("[...document.querySelectorAll('#hosts tr.host')].map(r => r.dataset.host)") == \
            ["node-000", "node-001"]
        browser.wait_for("document.querySelectorAll('#hosts tr.host-gpus tbody tr').length === 8")
        assert browser.js("document.getElementById('heatmap').dataset.rows") == "8"
        assert browser.js("document.getElementById('ofu-note').hidden") is False  # H100s beside H200s

        rows = job_report(PrometheusBackend(prometheus).job("train-1000"))
        browser.goto(f"{page}#view=job&job=train-1000")
        browser.wait_for(f"document.querySelectorAll('#job-gpus tbody tr').length === {len(rows.gpus)}")
        shown = browser.js("[...document.querySelectorAll('#job-gpus tbody tr')].map(r => [r.cells[0].textContent, "
                           "r.cells[2].textContent])")
        assert shown == [[f"{g.host} / GPU {g.gpu_index}", f"{100 * g.ofu_ratio:.1f}%"] for g in rows.gpus]
        # the mix from kernelfleet_bottleneck_class, minute by minute: what the backend's rows say
        mix = browser.js("document.getElementById('job-mix-list').textContent")
        if rows.bottleneck_shares:
            assert all(name in mix for name in rows.bottleneck_shares), mix
        else:
            assert mix.startswith("no bottleneck classes"), mix
        assert browser.js("document.getElementById('job-usd').textContent").startswith("$")
        assert not browser.console, browser.console
    finally:
        browser.close()
