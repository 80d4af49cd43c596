"""Pods' workloads from the API server (``agent --pod-owners api``), against a real HTTPS server on
loopback with a certificate openssl made for it: the client verifies it against the CA file as it
would the cluster's, sends the ServiceAccount token, asks once per pod, and falls back to the pod's
name in one log line when the server refuses, drips, floods or answers nonsense."""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kernelfleet.fleet.pods import pod_jobs
from kernelfleet.telemetry import kubeapi
from kernelfleet.telemetry.kubeapi import PodOwners, workload_of
from kernelfleet.telemetry.scrape import PodRef

pytestmark = pytest.mark.unit

TOKEN = "sa-token-1"


def pod(labels=None, owner=None) -> dict:
    meta = {"name": "x", "namespace": "ml", "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": "Node", "name": "not-a-controller"}, {**owner, "controller": True}]
    return {"kind": "Pod", "metadata": meta}


# A JobSet "train" with replicated jobs "driver" and "workers": the names say two workloads, the labels one.
PODS = {
    "train-driver-0-0-x7k2p": pod({kubeapi.JOBSET_LABEL: "train", "batch.kubernetes.io/job-name": "train-driver-0"},
                                  {"kind": "Job", "name": "train-driver-0"}),
    "train-workers-0-3-9dq4m": pod({kubeapi.JOBSET_LABEL: "train", "batch.kubernetes.io/job-name": "train-workers-0"},
                                   {"kind": "Job", "name": "train-workers-0"}),
    "serve-7d9f8b6c4-x2k4q": pod({"pod-template-hash": "7d9f8b6c4"}, {"kind": "ReplicaSet", "name": "serve-7d9f8b6c4"}),
    "db-2": pod({}, {"kind": "StatefulSet", "name": "db"}),
    "sweep-lr-3-mmmmm": pod({"job-name": "sweep-lr"}, {"kind": "Job", "name": "sweep-lr"}),
    "bare": pod(),
}


@pytest.mark.parametrize("name, workload", [
    ("train-driver-0-0-x7k2p", "train"), ("train-workers-0-3-9dq4m", "train"), ("serve-7d9f8b6c4-x2k4q", "serve"),
    ("db-2", "db"), ("sweep-lr-3-mmmmm", "sweep-lr"), ("bare", None)])
def test_the_workload_a_pod_object_names(name, workload):
    assert workload_of(PODS[name]) == workload


@pytest.mark.parametrize("broken", [
    {}, {"metadata": []}, {"metadata": {"labels": ["a"]}}, {"metadata": {"labels": {kubeapi.JOBSET_LABEL: 7}}},
    {"metadata": {"ownerReferences": "x"}}, {"metadata": {"ownerReferences": [{"controller": True}]}},
    {"metadata": {"ownerReferences": [{"controller": True, "name": ""}]}}, {"metadata": {"ownerReferences": [3]}}])
def test_a_malformed_pod_object_names_no_workload(broken):
    assert workload_of(broken) is None


class Api(BaseHTTPRequestHandler):
    """GET /api/v1/namespaces/ml/pods/NAME: PODS[NAME]; special names misbehave; the token is checked."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        name = self.path.rsplit("/", 1)[-1]
        Api.seen.append(name)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send(401, b'{"kind":"Status","code":401}')
        if name == "forbidden":
            return self._send(403, b'{"kind":"Status","code":403}')
        if name == "drip":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
            return None
        if name == "flood":
            return self._send(200, b" " * (kubeapi.MAX_BODY_BYTES + 10))
        if name == "nonsense":
            return self._send(200, b"[1, 2")
        found = PODS.get(name)
        return self._send(200, json.dumps(found).encode()) if found else self._send(404, b"{}")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # the client gave up, as it should
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """A real HTTPS server on loopback and a PodOwners client that trusts its certificate only."""
    folder = tmp_path_factory.mktemp("api")
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    account = folder / "account"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    cert_copy = account / "ca.crt"
    cert_copy.write_bytes(cert.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.server_address[1])}
    yield account, env
    server.shutdown()


def owners(api) -> PodOwners:
    account, env = api
    found = PodOwners.in_cluster(account, env)
    assert found is not None
    return found


def test_pods_of_one_jobset_are_one_job_and_each_pod_is_asked_for_once(api):
    client = owners(api)
    Api.seen.clear()
    refs = [PodRef("ml", "train-driver-0-0-x7k2p", "driver"), PodRef("ml", "train-workers-0-3-9dq4m", "worker")]
    for _ in range(3):  # a window after another: answers come from the cache
        asked = tuple(PodRef(r.namespace, r.pod, r.container, client.workload(r.namespace, r.pod)) for r in refs)
    assert Api.seen == ["train-driver-0-0-x7k2p", "train-workers-0-3-9dq4m"]
    (share,) = pod_jobs(asked)
    assert share.job == "k8s:ml/train" and share.namespace == "ml"
    # by name alone they are the JobSet's two replicated jobs
    assert sorted(s.job for s in pod_jobs(refs)) == ["k8s:ml/train-driver", "k8s:ml/train-workers"]
    assert client.workload("ml", "serve-7d9f8b6c4-x2k4q") == "serve" and client.workload("ml", "db-2") == "db"


def test_a_pod_the_server_does_not_have_keeps_its_name_and_is_no_outage(api, caplog):
    client = owners(api)
    with caplog.at_level(logging.WARNING, logger=kubeapi.__name__):
        assert client.workload("ml", "gone-0") is None
        assert client.workload("ml", "db-2") == "db"
    assert caplog.records == []


@pytest.mark.parametrize("name", ["forbidden", "drip", "flood", "nonsense"])
def test_a_failing_answer_falls_back_to_the_name_in_one_line(api, name, caplog):
    client = owners(api)
    now = [0.0]
    client.clock = lambda: now[0]
    Api.seen.clear()
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=kubeapi.__name__):
        assert client.workload("ml", name) is None
        # while it fails, every pod is answered from its name at once, with no request
        assert client.workload("ml", name) is None and client.workload("ml", "db-2") is None
        assert Api.seen == [name]
        now[0] += kubeapi.RETRY_SECONDS  # a minute later one request tries again, and a good pod resolves
        assert client.workload("ml", "db-2") == "db"
    assert time.monotonic() - began < kubeapi.DEADLINE_SECONDS + 1.5  # a drip does not hold the window
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[1] == "pod owners: the API server answers again"
    assert "reading workloads from pod names" in lines[0] and "Traceback" not in lines[0]
    if name == "forbidden":
        assert "HTTP 403" in lines[0] and "deploy/kubernetes/pod-owners" in lines[0]
    # meanwhile the pod kept its name rule's job
    assert pod_jobs((PodRef("ml", "train-driver-0-0-x7k2p", None, None),))[0].job == "k8s:ml/train-driver"


def test_a_certificate_the_cluster_ca_did_not_sign_is_refused(api, tmp_path, caplog):
    account, env = api
    other = tmp_path / "account"
    other.mkdir()
    (other / "token").write_text(TOKEN)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other",
                    "-keyout", str(tmp_path / "k"), "-out", str(other / "ca.crt")], check=True, capture_output=True)
    client = PodOwners.in_cluster(other, env)
    with caplog.at_level(logging.WARNING, logger=kubeapi.__name__):
        assert client.workload("ml", "db-2") is None
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


def test_outside_a_pod_it_says_so_once_and_is_off(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=kubeapi.__name__):
        assert PodOwners.in_cluster(tmp_path, {}) is None
    assert "not in a Kubernetes pod" in caplog.text
