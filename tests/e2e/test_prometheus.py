"""A real Prometheus server scrapes a real agent; promtool checks the exposition."""

import json
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from e2e_helpers import binary, free_port, wait_http
from kernelfleet.catalog import Catalog
from kernelfleet.fleet.store import Store

pytestmark = pytest.mark.e2e


def get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def test_promtool_accepts_the_exposition(agent):
    text = get(f"http://127.0.0.1:{agent['port']}/metrics")
    assert "kernelfleet_ofu_ratio{" in text
    done = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def query(base: str, q: str) -> list:
    return json.loads(get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})))["data"]["result"]


def wait_for_series(base: str, q: str, timeout: float = 60.0) -> list:
    deadline = time.monotonic() + timeout
    while not (result := query(base, q)) and time.monotonic() < deadline:
        time.sleep(1)
    assert result, f"Prometheus never saw {q}"
    return result


def test_prometheus_scrapes_ofu_and_joins_gpu_info(prometheus):
    (series,) = wait_for_series(prometheus, "kernelfleet_ofu_ratio")
    assert series["metric"]["model"] == "h200-sxm" and series["metric"]["job"] == "kernelfleet"
    assert 0.0 <= float(series["value"][1]) <= 1.1
    (joined,) = query(prometheus, "kernelfleet_ofu_ratio * on (uuid) group_left (sku) kernelfleet_gpu_info")
    assert joined["metric"]["sku"] == "h200-sxm"
    (ref,) = query(prometheus, "kernelfleet_reference_clock_hertz")
    # the demo recording is HMMA-pipe work (or idle): the H200's f_ref for that pipe, 1830 MHz / 0.903
    assert float(ref["value"][1]) == pytest.approx(Catalog.load().get("h200-sxm").ofu_reference_clock("hmma")[0])
    (held,) = wait_for_series(prometheus, "kernelfleet_job_info")
    assert held["metric"]["job_id"].startswith("python3-") and held["metric"]["job"] == "kernelfleet"


def test_fleet_dashboard_reads_prometheus(agent, prometheus, tmp_path):
    wait_for_series(prometheus, "kernelfleet_job_info")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kernelfleet", "dashboard", "--prometheus", prometheus,
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz")
        (local,) = json.loads(get(f"http://127.0.0.1:{agent['port']}/api/gpus"))["gpus"]
        (remote,) = json.loads(get(f"{base}/api/gpus"))["gpus"]
        assert (remote["uuid"], remote["sku"], remote["host"]) == (local["uuid"], "h200-sxm", local["host"])
        assert remote["bottleneck"] in ("tensor-bound", "low-occupancy/launch-bound", "idle", "memory-bound", "mixed")
        assert [j["job"] for j in remote["jobs"]] == [j["job"] for j in local["jobs"]]
        assert json.loads(get(f"{base}/api/fleet"))["gpus"] == 1
        now = time.time()
        points = json.loads(get(f"{base}/api/series?" + urllib.parse.urlencode(
            {"uuid": local["uuid"], "start": now - 300, "end": now + 60})))["points"]
        assert points and all(0 <= p["ofu"] <= 1.1 for p in points)
        fleet_points = json.loads(get(f"{base}/api/fleet/series?" + urllib.parse.urlencode(
            {"start": now - 300, "end": now + 60})))["points"]
        assert fleet_points and all(p["gpus"] == 1 and 0 <= p["ofu"] <= 1.1 for p in fleet_points)
        (summary,) = json.loads(get(f"{base}/api/jobs/summary"))
        assert summary["job"] == local["jobs"][0]["job"] and summary["gpus"] == 1
        for path in ("/api/jobs/no-such-job", "/api/series?uuid=GPU-nope&start=0&end=1"):
            with pytest.raises(urllib.error.HTTPError) as err:
                get(base + path)
            assert err.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
