"""Jobs end to end on a recording: attribution, the store's job report, regressions, API, CLI."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent, attribute_recorded
from kernelfleet.fleet.server import agent_app
from kernelfleet.fleet.store import Store
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
DROP = Path(__file__).parents[1] / "data" / "h200-detector" / "h200-drop.jsonl.gz"


@pytest.fixture
def drop_store(tmp_path):
    store = Store(tmp_path / "kf.db")
    agent = Agent(ReplaySource(DROP), store, Catalog.load(), host="node-1", identify=attribute_recorded)
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


def test_job_api_and_404(drop_store):
    agent, store = drop_store
    client = TestClient(agent_app(agent, store))
    (job,) = client.get("/api/jobs").json()
    assert client.get(f"/api/jobs/{job}").json()["job"] == job
    assert client.get("/api/jobs/nope").status_code == 404
    assert len(client.get("/api/events").json()) == 2
    text = client.get("/metrics").text
    assert f'kernelfleet_job_info{{job_id="{job}",kind="recorded",mig="",user="",uuid=' in text


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
