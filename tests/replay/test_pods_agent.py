"""The agent as a process, replaying two H200s' DDP recording, with a fake kubelet (a real gRPC
server on a unix socket) that gives each GPU to one pod of the indexed Job ``ddp-train``: its
/metrics name each GPU's namespace, pod and container, and the two pods are one job in the API
and the store. Without the socket the agent runs on, attribution off, after one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from recorded import kubelet_reply, serve_pod_resources

pytestmark = pytest.mark.replay

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
DDP = DATA / "h200x2-detector" / "h200x2-ddp.jsonl.gz"
IDLE = DATA / "h200" / "h200-idle.jsonl.gz"
GPU0, GPU1 = "GPU-0108b095-397f-7583-e087-ade158522fa2", "GPU-55d37422-bff2-c836-a83a-3874cd9b1808"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> str | None:
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def test_the_agent_labels_gpus_with_their_pods_and_groups_the_jobs_pods(tmp_path):
    reply = kubelet_reply(json.loads((DATA / "kubelet" / "list-h200x2.json").read_text()))
    kubelet = serve_pod_resources(tmp_path / "kubelet.sock", lambda request, context: reply)
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet", "agent", "--replay", str(DDP), "--speed", "2",
         "--store", str(tmp_path / "kf.db"), "--listen", f"127.0.0.1:{port}",
         "--pod-resources-socket", str(tmp_path / "kubelet.sock")],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        metrics = None
        while agent.poll() is None and time.monotonic() < deadline:
            metrics = get(f"{base}/metrics")
            if metrics and metrics.count("kernelfleet_job_info{") >= 2:
                break
            time.sleep(0.2)
        assert metrics, f"the agent never served /metrics: {agent.stderr.read() if agent.poll() is not None else ''}"
        ofu = {line.split(" ")[0] for line in metrics.splitlines() if line.startswith("kernelfleet_ofu_ratio{")}
        for uuid, pod in ((GPU0, "ddp-train-0-x7k2p"), (GPU1, "ddp-train-1-9dq4m")):
            (series,) = [s for s in ofu if f'uuid="{uuid}"' in s]
            assert 'namespace="ml"' in series and f'pod="{pod}"' in series and 'container="trainer"' in series
        info = [line for line in metrics.splitlines() if line.startswith("kernelfleet_job_info{")]
        assert len(info) == 2
        assert all('job_id="k8s:ml/ddp-train"' in line and 'kind="kubernetes"' in line for line in info), info

        gpus = json.loads(get(f"{base}/api/gpus"))["gpus"]
        holders = {g["uuid"]: [(j["job"], j["namespace"], j["pod"], j["container"]) for j in g["jobs"]] for g in gpus}
        assert holders == {GPU0: [("k8s:ml/ddp-train", "ml", "ddp-train-0-x7k2p", "trainer")],
                           GPU1: [("k8s:ml/ddp-train", "ml", "ddp-train-1-9dq4m", "trainer")]}
        deadline = time.monotonic() + 30
        while "k8s:ml/ddp-train" not in (get(f"{base}/api/jobs") or "") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads(get(f"{base}/api/jobs")) == ["k8s:ml/ddp-train"]  # one job of two pods, in the store
        report = json.loads(get(f"{base}/api/jobs/k8s:ml/ddp-train"))
        assert {g["uuid"] for g in report["gpus"]} == {GPU0, GPU1}
    finally:
        agent.kill()
        agent.wait(timeout=10)
        kubelet.stop(None)
    assert "Traceback" not in agent.stderr.read()


def test_without_the_socket_the_agent_runs_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kernelfleet", "agent", "--replay", str(IDLE), "--speed", "100",
         "--store", str(tmp_path / "kf.db"), "--listen", f"127.0.0.1:{free_port()}",
         "--pod-resources-socket", str(tmp_path / "missing.sock")],
        env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "pod attribution" in line]
    hint = "(mount the kubelet's /var/lib/kubelet/pod-resources into the agent)"
    assert lines == [f"kernelfleet: pod attribution off: {tmp_path / 'missing.sock'} does not exist {hint}"]
    assert "Traceback" not in done.stderr
