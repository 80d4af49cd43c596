"""The kubelet's pod-resources API as kernelfleet reads it, against a real gRPC server on a unix
socket: GPU holders from a reply of a kubelet's shape, owners from pod names, the labels the
exporter puts on, and every failure (no socket, hung kubelet, kubelet gone, bytes that are no
reply, an oversized reply, 300 mutants of a reply) as one log line, never an exception."""

from __future__ import annotations

import json
import logging
import random
import threading
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry
from recorded import kubelet_reply, serve_pod_resources

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.owners import owner
from kernelfleet.fleet.pods import pod_jobs, sample_holders
from kernelfleet.telemetry import podresources
from kernelfleet.telemetry.podresources import PodResources, device_holders
from kernelfleet.telemetry.sample import Sample
from kernelfleet.telemetry.scrape import PodRef

pytestmark = pytest.mark.unit

DATA = Path(__file__).parents[1] / "data" / "kubelet"
GPU0, GPU1 = "GPU-0108b095-397f-7583-e087-ade158522fa2", "GPU-55d37422-bff2-c836-a83a-3874cd9b1808"
MIG = "MIG-2f5c9a34-8d1e-5b7a-9c3f-0e6d4b8a1c27"
LOGGER = "kernelfleet.telemetry.podresources"


def reply() -> bytes:
    return kubelet_reply(json.loads((DATA / "list-h200x2.json").read_text()))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def kubelet(tmp_path):
    """A fake kubelet; ``answers`` is what List replies (bytes, or a callable raising for a status)."""
    state = {"answer": reply(), "calls": 0}

    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        state["calls"] += 1
        value = state["answer"]
        return value(context) if callable(value) else value

    path = tmp_path / "kubelet.sock"
    server = serve_pod_resources(path, answer)
    state["path"], state["server"] = path, server
    yield state
    server.stop(None)


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_holders_of_each_gpu_from_a_kubelet_reply(kubelet):
    client = PodResources.open(kubelet["path"])
    assert client is not None
    assert client.holders() == {
        GPU0: (PodRef("ml", "ddp-train-0-x7k2p", "trainer"),),
        GPU1: (PodRef("ml", "ddp-train-1-9dq4m", "trainer"),),  # its RDMA device is not a GPU
        MIG: (PodRef("inference", "vllm-qwen2-7b-6d9f8c7b5-x2kqp", "vllm"),),
    }
    client.close()


def test_asks_at_most_every_refresh_and_again_after_it(kubelet):
    clock = Clock()
    client = PodResources(kubelet["path"], refresh_seconds=10.0, clock=clock)
    for t in (0.0, 1.0, 9.9):
        clock.t = t
        client.holders()
    assert kubelet["calls"] == 1
    clock.t = 10.0
    client.holders()
    assert kubelet["calls"] == 2


def test_time_sliced_replicas_are_one_gpu_with_each_container_once():
    doc = {"podResources": [
        {"name": "a-0", "namespace": "x", "containers": [
            {"name": "c", "devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": [f"{GPU0}::0", f"{GPU0}::3"]}]}]},
        {"name": "b-7f9c6d5b8-2kq4z", "namespace": "y", "containers": [
            {"name": "d", "devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": [f"{GPU0}::1"]}]}]},
    ]}
    refs = device_holders(kubelet_reply(doc))[GPU0]
    assert refs == (PodRef("x", "a-0", "c"), PodRef("y", "b-7f9c6d5b8-2kq4z", "d"))
    # Two workloads time-share it: two jobs, half each, approximate; no single pod on the GPU.
    jobs = pod_jobs(refs)
    assert [(j.job, j.share, j.approximate, j.pod) for j in jobs] == [
        ("k8s:x/a", 0.5, True, "a-0"), ("k8s:y/b", 0.5, True, "b-7f9c6d5b8-2kq4z")]


def test_gpus_by_uuid_mig_uuid_or_index():
    holders = {GPU0: (PodRef("ml", "p", "c"),), MIG: (PodRef("i", "q", None),), "1": (PodRef("ml", "r", "c"),)}
    whole = Sample(0.0, 1.0, 0, GPU0, "NVIDIA H200")
    mig = Sample(0.0, 1.0, 1, MIG, "NVIDIA H200", mig_instance=1)
    by_index = Sample(0.0, 1.0, 1, GPU1, "NVIDIA H200")
    other_mig = Sample(0.0, 1.0, 1, "MIG-other", "NVIDIA H200", mig_instance=2)
    assert [sample_holders(holders, s) for s in (whole, mig, by_index, other_mig)] == [
        holders[GPU0], holders[MIG], holders["1"], ()]


@pytest.mark.parametrize(("pod", "workload"), [
    ("ddp-train-0-x7k2p", "ddp-train"),  # indexed Job
    ("ddp-train-x7k2p", "ddp-train"),  # Job
    ("vllm-qwen2-7b-6d9f8c7b5-x2kqp", "vllm-qwen2-7b"),  # Deployment -> ReplicaSet
    ("llama-8b-pretrain-worker-0", "llama-8b-pretrain-worker"),  # StatefulSet
    ("pretrain-workers-1-3-9dq4m", "pretrain-workers"),  # JobSet "pretrain", replicated job "workers"
    ("offline-scoring-28471680-qv7tn", "offline-scoring"),  # CronJob -> Job
    ("nvidia-dcgm-exporter-q2w9z", "nvidia-dcgm-exporter"),  # DaemonSet
    ("notebook", "notebook"),  # a bare pod
    ("train-model-x7k2p", "train-model"),  # "model" is 5 letters, not a pod-template hash
])
def test_owner_from_the_pod_name(pod, workload):
    assert owner(pod) == workload


def test_namespace_pod_container_labels_on_every_per_gpu_series_and_the_job_series(kubelet):
    client = PodResources(kubelet["path"])
    samples = [Sample(1.0e9, 1.0, i, uuid, "NVIDIA H200", pci_device_id=0x2335, tensor_active_ratio=0.5,
                      sm_clock_mean_hertz=1.98e9) for i, uuid in enumerate((GPU0, GPU1, "GPU-free"))]
    agent = Agent(iter(()), None, Catalog.load(), host="node-1", clock=lambda: 1.0e9,
                  pods=lambda s: sample_holders(client.holders(), s))
    agent.step(samples)
    registry = CollectorRegistry()
    registry.register(OfuCollector(agent.latest))
    text = generate_latest(registry).decode()
    per_gpu = [line for line in text.splitlines() if line.startswith("kernelfleet_ofu_ratio{")]
    assert len(per_gpu) == 3
    assert any('pod="ddp-train-0-x7k2p"' in line and 'namespace="ml"' in line and 'container="trainer"' in line
               and GPU0 in line for line in per_gpu)
    assert any('namespace="",pod=""' in line and "GPU-free" in line for line in per_gpu)  # no pod holds it
    # Both pods of the Job are one job, each GPU's series naming its own pod.
    info = [line for line in text.splitlines() if line.startswith("kernelfleet_job_info{")]
    assert len(info) == 2 and all('job_id="k8s:ml/ddp-train"' in line and 'kind="kubernetes"' in line for line in info)
    assert {p for line in info for p in ("ddp-train-0-x7k2p", "ddp-train-1-9dq4m") if f'pod="{p}"' in line} == {
        "ddp-train-0-x7k2p", "ddp-train-1-9dq4m"}


def test_no_socket_is_attribution_off_in_one_line(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING, LOGGER):
        assert PodResources.open(tmp_path / "kubelet.sock") is None
        assert PodResources.open(tmp_path / "file") is None
    hint = "(mount the kubelet's /var/lib/kubelet/pod-resources into the agent)"
    assert lines(caplog) == [f"pod attribution off: {tmp_path / 'kubelet.sock'} does not exist {hint}",
                             f"pod attribution off: {tmp_path / 'file'} is not a socket {hint}"]


def test_a_hung_kubelet_costs_one_deadline_and_one_line(kubelet, caplog):
    release = threading.Event()

    def hang(context):
        release.wait(10)
        return b""

    kubelet["answer"] = hang
    clock = Clock()
    client = PodResources(kubelet["path"], deadline_seconds=0.2, refresh_seconds=1.0, clock=clock)
    with caplog.at_level(logging.WARNING, LOGGER):
        assert client.holders() == {}
        clock.t = 1.0
        assert client.holders() == {}  # still failing: no second line
    release.set()
    (line,) = lines(caplog)
    assert "pod attribution paused" in line and "DEADLINE_EXCEEDED" in line


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(kubelet, caplog):
    clock = Clock()
    client = PodResources(kubelet["path"], refresh_seconds=1.0, clock=clock)

    def refuse(context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")

    with caplog.at_level(logging.WARNING, LOGGER):
        assert client.holders()
        kubelet["answer"] = refuse
        for t in (1.0, 2.0, 3.0):
            clock.t = t
            assert client.holders() == {}  # GPUs fall back to process attribution meanwhile
        kubelet["answer"] = reply()
        clock.t = 4.0
        assert client.holders()
    assert [line.split(":")[0] for line in lines(caplog)] == ["pod attribution paused", "pod attribution back"]
    assert "UNAVAILABLE: kubelet restarting" in lines(caplog)[0]


def test_bytes_that_are_no_reply_and_an_oversized_reply_are_one_line_each(kubelet, caplog, monkeypatch):
    clock = Clock()
    client = PodResources(kubelet["path"], refresh_seconds=1.0, clock=clock)
    kubelet["answer"] = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, a length past the end
    with caplog.at_level(logging.WARNING, LOGGER):
        assert client.holders() == {}
    assert "is not a pod-resources List reply" in lines(caplog)[0]
    kubelet["answer"] = reply()
    clock.t = 1.0
    assert client.holders()  # back
    # Over the cap: refused by grpc before it is parsed.
    monkeypatch.setattr(podresources, "MAX_REPLY_BYTES", 1024)
    small = PodResources(kubelet["path"])
    kubelet["answer"] = bytes(10_000)
    caplog.clear()
    with caplog.at_level(logging.WARNING, LOGGER):
        assert small.holders() == {}
    (line,) = lines(caplog)
    assert "RESOURCE_EXHAUSTED" in line


def test_300_mutants_of_a_reply_never_raise_and_fail_in_one_line(kubelet, caplog):
    good = reply()
    rng = random.Random(18)
    parsed = failed = 0
    with caplog.at_level(logging.WARNING, LOGGER):
        for _ in range(300):
            mutant = bytearray(good)
            for _ in range(rng.randint(1, 8)):
                op = rng.random()
                at = rng.randrange(len(mutant))
                if op < 0.5:
                    mutant[at] = rng.randrange(256)
                elif op < 0.75:
                    del mutant[at:at + rng.randint(1, 16)]
                else:
                    mutant[at:at] = rng.randbytes(rng.randint(1, 8))
            kubelet["answer"] = bytes(mutant)
            caplog.clear()
            client = PodResources(kubelet["path"])  # each mutant on its own: every failure logs its line
            holders = client.holders()
            client.close()
            assert all(isinstance(k, str) and all(isinstance(r, PodRef) for r in v) for k, v in holders.items())
            if holders or not lines(caplog):
                parsed += 1
            else:
                failed += 1
                (line,) = lines(caplog)
                assert "\n" not in line and "Traceback" not in line
    assert parsed and failed  # both kinds met: the corpus exercises the parser and its error path
