"""A real Prometheus server scrapes a real agent; promtool checks the exposition."""

import json
import signal
import sqlite3
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from e2e_helpers import binary, free_port, wait_http
from kernelfleet.fleet.store import Store

pytestmark = pytest.mark.e2e


def get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def test_promtool_accepts_the_exposition(agent):
    text = get(f"http://127.0.0.1:{agent['port']}/metrics")
    assert "kernelfleet_ofu_ratio{" in text
    done = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_scrapes_ofu_and_joins_gpu_info(agent, tmp_path):
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n"
        f"  - job_name: kernelfleet\n    static_configs:\n      - targets: ['127.0.0.1:{agent['port']}']\n"
    )
    prom = subprocess.Popen(
        [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60)

        def query(q: str) -> list:
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            return json.loads(get(url))["data"]["result"]

        deadline = time.monotonic() + 60
        while not (result := query("kernelfleet_ofu_ratio")) and time.monotonic() < deadline:
            time.sleep(1)
        assert result, "Prometheus never saw kernelfleet_ofu_ratio"
        (series,) = result
        assert series["metric"]["model"] == "h200-sxm" and series["metric"]["job"] == "kernelfleet"
        assert 0.0 <= float(series["value"][1]) <= 1.1
        (joined,) = query("kernelfleet_ofu_ratio * on (uuid) group_left (sku) kernelfleet_gpu_info")
        assert joined["metric"]["sku"] == "h200-sxm"
        (ref,) = query("kernelfleet_reference_clock_hertz")
        assert float(ref["value"][1]) == 1.98e9
    finally:
        prom.send_signal(signal.SIGTERM)
        prom.wait(timeout=30)


def test_kill_9_loses_at_most_the_last_batch_and_the_store_reopens(agent):
    time.sleep(3.0)  # a dozen windows at 4x
    written = json.loads(get(f"http://127.0.0.1:{agent['port']}/healthz"))["windows"]
    agent["proc"].send_signal(signal.SIGKILL)
    agent["proc"].wait(timeout=10)
    db = sqlite3.connect(agent["store"])
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert written >= 5 and rows >= written  # every window the agent had reported is on disk
    store = Store(agent["store"])  # reopens cleanly after the crash (WAL recovery)
    (gpu,) = store.gpus()
    assert len(store.series(gpu["uuid"], 0, 4e9)) == rows
