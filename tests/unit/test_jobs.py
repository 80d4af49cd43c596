"""Jobs end to end on a recording: attribution, the store's job report, regressions, API, CLI."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from recorded import at_end_of

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent, attribute_recorded
from kernelfleet.fleet.report import job_report
from kernelfleet.fleet.server import agent_app
from kernelfleet.fleet.store import Store
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
DROP = Path(__file__).parents[1] / "data" / "h200-detector" / "h200-drop.jsonl.gz"


@pytest.fixture
def drop_store(tmp_path):
    store = Store(tmp_path / "kf.db")
    agent = Agent(ReplaySource(DROP), store, Catalog.load(), host="node-1", identify=attribute_recorded,
                  clock=at_end_of(DROP))
    agent.run(threading.Event())
    return agent, store


def test_the_recorded_job_is_reported_with_its_regression(drop_store):
    agent, store = drop_store
    (job,) = store.jobs()
    assert job.startswith("python3-")
    report = store.job_report(job)
    (gpu,) = report["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["mean_share"] == 1.0 and not gpu["approximate"]
    assert 0.4 < gpu["ofu_ratio"] < 0.5  # half the run at 0.69, half at 0.27
    assert max(report["bottleneck_seconds"], key=report["bottleneck_seconds"].get) in ("tensor-bound", "low-occupancy/launch-bound")
    kinds = [(e["kind"], e["job"] is not None, e["uuid"] is not None) for e in report["events"]]
    assert kinds == [("regression", True, False)]
    gpu_events = [e for e in store.events() if e["uuid"]]
    assert [e["kind"] for e in gpu_events] == ["regression"]  # the GPU's own detector agrees


def test_the_job_reports_rows(drop_store):
    """What ``kernelfleet job NAME`` shows, as rows: half the run at 0.69 OFU, half at 0.27."""
    _, store = drop_store
    (job,) = store.jobs()
    rows = job_report(store.job_report(job))
    assert (rows.job, rows.kind, rows.user) == (job, "recorded", None)
    (gpu,) = rows.gpus
    assert (gpu.host, gpu.gpu_index, gpu.name, gpu.mean_share, gpu.approximate) == ("node-1", 0, "NVIDIA H200", 1.0, False)
    assert (round(gpu.ofu_ratio, 3), round(gpu.seconds)) == (0.459, 94)
    assert {k: round(v, 3) for k, v in rows.bottleneck_shares.items()} == {
        "low-occupancy/launch-bound": 0.489, "tensor-bound": 0.489, "idle": 0.021}
    assert rows.minute_levels == [5, 2]  # 0.578 and 0.259 OFU, eight levels up to 0.8
    (event,) = rows.events
    assert event.kind == "regression" and event.detail.startswith(f"OFU of job {job} dropped to 0.429")
    assert rows.first_seen < event.ts < rows.last_seen


def test_job_report_rows_without_windows_of_a_class_or_an_ofu():
    rows = job_report({
        "job": "j", "kind": "slurm", "user": "ana", "first_seen": 0.0, "last_seen": 60.0, "events": [],
        "gpus": [{"host": "h", "gpu_index": 1, "uuid": "GPU-1", "mig_instance": None, "name": "NVIDIA H200",
                  "ofu_ratio": None, "seconds": 60.0, "mean_share": 0.5, "approximate": True}],
        "bottleneck_seconds": {}, "timeline_1m": [{"ts": 0, "ofu_ratio": None}, {"ts": 60, "ofu_ratio": 0.95}]})
    assert rows.gpus[0].ofu_ratio is None and rows.gpus[0].approximate
    assert rows.bottleneck_shares == {} and rows.minute_levels == [0, 8]  # no OFU is the lowest bar; 0.8 and up the top


def test_job_api_and_404(drop_store):
    agent, store = drop_store
    client = TestClient(agent_app(agent, store))
    (job,) = client.get("/api/jobs").json()
    assert client.get(f"/api/jobs/{job}").json()["job"] == job
    assert client.get("/api/jobs/nope").status_code == 404
    assert len(client.get("/api/events").json()) == 2
    text = client.get("/metrics").text
    assert f'kernelfleet_job_info{{container="",job_id="{job}",kind="recorded",mig="",namespace="",pod="",user="",uuid=' in text


def test_job_cli(drop_store):
    _, store = drop_store
    (job,) = store.jobs()
    run = lambda *a: subprocess.run([sys.executable, "-m", "kernelfleet", "job", *a, "--store", str(store.path)],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    done = run(job)
    assert done.returncode == 0 and "regression" in done.stdout and "OFU per minute" in done.stdout
    assert json.loads(run(job, "--json").stdout)["job"] == job
    missing = run("no-such-job")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and job in missing.stderr


def test_job_cli_prints_what_the_job_spent_below_an_ofu(drop_store):
    """The job page's GPU-hours and dollars below an OFU, in the terminal: the store's own seconds
    below the threshold, priced from the catalog or at --usd-per-gpu-hour."""
    _, store = drop_store
    (job,) = store.jobs()
    run = lambda *a: subprocess.run([sys.executable, "-m", "kernelfleet", "job", job, *a, "--store", str(store.path)],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    hours = sum(store.job_seconds_below(job, 0.9).values()) / 3600
    assert hours > 0
    found = json.loads(run("--json", "--below-ofu", "0.9", "--usd-per-gpu-hour", "2.5").stdout)["spent"]
    assert found["gpu_hours"] == pytest.approx(hours) and found["usd"] == pytest.approx(2.5 * hours)
    done = run("--below-ofu", "0.9", "--usd-per-gpu-hour", "2.5")
    assert done.returncode == 0, done.stderr
    assert f"below 90% OFU: {hours:.2f} GPU-hours, ${2.5 * hours:,.2f}" in done.stdout
    assert "$2.50/GPU-hour, set with --usd-per-gpu-hour" in done.stdout
    catalog = run("--below-ofu", "0.9").stdout  # the H200's lowest listed price, and where it is from
    assert "/GPU-hour, catalog: " in catalog
    bad = run("--below-ofu", "2")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--below-ofu" in bad.stderr
