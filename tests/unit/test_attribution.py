"""Job attribution on fake /proc trees built from recorded cgroup, environ and status files."""

import builtins

from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.fleet import attribution
from kernelfleet.fleet.attribution import JobIdentity, attribute, split_shared

pytestmark = pytest.mark.unit
DATA = Path(__file__).parents[1] / "data"
PROC = DATA / "proc"
USERS = {0: "root", 1000: "alice"}.get

K8S_SYSTEMD_UID = "4a16411d-4c41-4263-a00b-cfb6f5792417"
K8S_SYSTEMD_CID = "4137f8642fb9c16fe3ca084f9217b9923d823b7e974e0a0ca09260a6fcb6be10"
K8S_SYSTEMD_SLICE = K8S_SYSTEMD_UID.replace("-", "_")
K8S_CGROUPFS_UID = "bc1e9a0d-fa08-48e1-a44a-9fcac5d97990"
K8S_CGROUPFS_CID = "1564c67bbedfe446a2de5614addf865e460b0ca88f0ebd7d8d1dc51cc277da80"
DOCKER_CID = "c4f5c445018e081a67281beaf212d536f2be6e9447d90b04a8a82e84da3beda8"


def recorded(name):
    return (PROC / name).read_text()


def fake_proc(root, pid=91234, cgroup="plain-user.cgroup", environ=None, status="python.status", env=()):
    """Write /proc/<pid>; file arguments name recordings (or are raw text when they hold a newline)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    text = {n: v if v is None or "\n" in v else recorded(v) for n, v in
            {"cgroup": cgroup, "environ": environ, "status": status}.items()}
    lines = (text["environ"] or "").splitlines() + list(env)
    if text["cgroup"] is not None:
        (d / "cgroup").write_text(text["cgroup"])
    if text["status"] is not None:
        (d / "status").write_text(text["status"])
    (d / "environ").write_bytes(b"".join(line.encode() + b"\0" for line in lines))
    return pid


def identity(pid=91234, job=None, kind="user", user="alice", pod_uid=None, namespace=None, pod_name=None,
             container_id=None, slurm_job_id=None, cgroup="/user.slice/user-1000.slice/session-4.scope"):
    return JobIdentity(pid, job, kind, user, pod_uid, namespace, pod_name, container_id, slurm_job_id, cgroup)


# --- precedence, one rule at a time ---------------------------------------------------------------

def test_label_wins_over_everything(tmp_path):
    pid = fake_proc(tmp_path, cgroup="slurm-v2.cgroup", environ="slurm-job.environ",
                    env=["KERNELFLEET_JOB=llama-70b/pretrain@v3"])
    assert attribute(pid, tmp_path, USERS) == identity(
        job="llama-70b/pretrain@v3", kind="label", slurm_job_id="4242",
        cgroup="/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")


def test_slurm_cgroup_v1_uses_the_most_specific_line(tmp_path):
    pid = fake_proc(tmp_path, cgroup="slurm-v1.cgroup")
    assert attribute(pid, tmp_path, USERS) == identity(
        job="slurm-4242", kind="slurm", slurm_job_id="4242", cgroup="/slurm/uid_1000/job_4242/step_0/task_0")


def test_slurm_cgroup_v2(tmp_path):
    pid = fake_proc(tmp_path, cgroup="slurm-v2.cgroup")
    assert attribute(pid, tmp_path, USERS) == identity(
        job="slurm-4242", kind="slurm", slurm_job_id="4242",
        cgroup="/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")


def test_slurm_cgroup_v2_with_several_slurmd_per_host(tmp_path):
    path = "/system.slice/gpu-node-17_slurmstepd.scope/job_981/step_batch/user/task_special"
    pid = fake_proc(tmp_path, cgroup=f"0::{path}\n")
    assert attribute(pid, tmp_path, USERS) == identity(job="slurm-981", kind="slurm", slurm_job_id="981",
                                                       cgroup=path)


def test_slurmstepd_itself_is_not_a_job(tmp_path):
    pid = fake_proc(tmp_path, cgroup="0::/system.slice/slurmstepd.scope/system\n",
                    status="Uid:\t0\t0\t0\t0\n")
    assert attribute(pid, tmp_path, USERS) == identity(job="user:root", user="root",
                                                       cgroup="/system.slice/slurmstepd.scope/system")


def test_slurm_from_the_environment_when_the_cgroup_does_not_say(tmp_path):
    pid = fake_proc(tmp_path, environ="slurm-job.environ")
    assert attribute(pid, tmp_path, USERS) == identity(job="slurm-4242", kind="slurm", slurm_job_id="4242")


def test_a_non_numeric_slurm_job_id_is_ignored(tmp_path):
    pid = fake_proc(tmp_path, env=["SLURM_JOB_ID=4242;rm"])
    assert attribute(pid, tmp_path, USERS) == identity(job="user:alice")


def test_slurm_comes_before_kubernetes(tmp_path):
    pid = fake_proc(tmp_path, cgroup="k8s-systemd.cgroup", environ="k8s-pod.environ", env=["SLURM_JOB_ID=77"])
    got = attribute(pid, tmp_path, USERS)
    assert (got.job, got.kind, got.kubernetes_pod_uid) == ("slurm-77", "slurm", K8S_SYSTEMD_UID)
    assert got.cgroup == recorded("k8s-systemd.cgroup")[3:-1]


def test_kubernetes_systemd_driver_with_downward_api_names(tmp_path):
    pid = fake_proc(tmp_path, cgroup="k8s-systemd.cgroup", environ="k8s-pod.environ")
    assert attribute(pid, tmp_path, USERS) == identity(
        job="k8s:ml-training/llama-finetune", kind="kubernetes", pod_uid=K8S_SYSTEMD_UID,  # its Deployment
        namespace="ml-training", pod_name="llama-finetune-7d9f8c6b5-x2k4q", container_id=K8S_SYSTEMD_CID,
        cgroup=recorded("k8s-systemd.cgroup")[3:-1])


def test_pod_name_prefers_pod_name_over_hostname(tmp_path):
    pid = fake_proc(tmp_path, cgroup="k8s-systemd.cgroup", environ="k8s-pod.environ",
                    env=["POD_NAME=llama-finetune-0", "KUBERNETES_NAMESPACE=ignored"])
    got = attribute(pid, tmp_path, USERS)
    assert (got.job, got.kubernetes_pod_name) == ("k8s:ml-training/llama-finetune", "llama-finetune-0")


def test_kubernetes_cgroupfs_driver_without_names(tmp_path):
    pid = fake_proc(tmp_path, cgroup="k8s-cgroupfs.cgroup", status="Uid:\t0\t0\t0\t0\n")
    path = f"/kubepods/besteffort/pod{K8S_CGROUPFS_UID}/{K8S_CGROUPFS_CID}"
    assert attribute(pid, tmp_path, USERS) == identity(
        job=f"k8s-pod:{K8S_CGROUPFS_UID}", kind="kubernetes", user="root", pod_uid=K8S_CGROUPFS_UID,
        container_id=K8S_CGROUPFS_CID, cgroup=path)


@pytest.mark.parametrize("path, container", [
    # Guaranteed pods have no QoS-class level, in either driver.
    (f"/kubepods.slice/kubepods-pod{K8S_SYSTEMD_SLICE}.slice/crio-{K8S_SYSTEMD_CID}.scope",
     K8S_SYSTEMD_CID),
    (f"/kubepods/pod{K8S_SYSTEMD_UID}/{K8S_SYSTEMD_CID}", K8S_SYSTEMD_CID),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{K8S_SYSTEMD_SLICE}.slice/"
     f"docker-{DOCKER_CID}.scope", DOCKER_CID),  # dockershim: still Kubernetes, not Docker
    (f"/kubepods/burstable/pod{K8S_SYSTEMD_UID}", None),  # the pod cgroup itself
])
def test_kubernetes_qos_classes_and_runtimes(tmp_path, path, container):
    pid = fake_proc(tmp_path, cgroup=f"0::{path}\n")
    assert attribute(pid, tmp_path, USERS) == identity(
        job=f"k8s-pod:{K8S_SYSTEMD_UID}", kind="kubernetes", pod_uid=K8S_SYSTEMD_UID, container_id=container,
        cgroup=path)


def test_docker_systemd_driver(tmp_path):
    pid = fake_proc(tmp_path, cgroup="docker.cgroup", env=["HOSTNAME=c4f5c445018e"])
    assert attribute(pid, tmp_path, USERS) == identity(
        job="docker:c4f5c445018e", kind="docker", container_id=DOCKER_CID,
        cgroup=f"/system.slice/docker-{DOCKER_CID}.scope")


def test_docker_cgroupfs_driver_v1(tmp_path):
    controllers = [(4, "memory"), (3, "devices"), (2, "cpuset")]
    lines = "".join(f"{n}:{c}:/docker/{DOCKER_CID}\n" for n, c in controllers)
    pid = fake_proc(tmp_path, cgroup=lines + "1:name=systemd:/docker/" + DOCKER_CID + "\n")
    assert attribute(pid, tmp_path, USERS) == identity(
        job="docker:c4f5c445018e", kind="docker", container_id=DOCKER_CID, cgroup=f"/docker/{DOCKER_CID}")


def test_systemd_service(tmp_path):
    pid = fake_proc(tmp_path, cgroup="systemd-service.cgroup")
    assert attribute(pid, tmp_path, USERS) == identity(job="vllm-server.service", kind="systemd",
                                                       cgroup="/system.slice/vllm-server.service")


def test_user_session(tmp_path):
    pid = fake_proc(tmp_path)
    assert attribute(pid, tmp_path, USERS) == identity(job="user:alice")


def test_uid_without_a_passwd_entry(tmp_path):
    status = "Name:\tpython\nUid:\t4321\t4321\t4321\t4321\nGid:\t100\t100\t100\t100\n"
    pid = fake_proc(tmp_path, status=status)
    assert attribute(pid, tmp_path, USERS) == identity(job="user:uid:4321", user="uid:4321")


def test_the_default_user_lookup_reads_passwd(tmp_path):
    pid = fake_proc(tmp_path, status="Uid:\t0\t0\t0\t0\n")
    assert attribute(pid, tmp_path).user == "root"


# --- missing, unreadable, malformed, hostile -----------------------------------------------------

def test_a_vanished_pid_is_unknown(tmp_path):
    assert attribute(424242, tmp_path, USERS) == JobIdentity(424242, None, "unknown", *[None] * 7)


def test_unreadable_environ_is_skipped(tmp_path, monkeypatch):
    pid = fake_proc(tmp_path, cgroup="k8s-systemd.cgroup", environ="k8s-pod.environ",
                    env=["KERNELFLEET_JOB=hidden"])
    real_open = builtins.open

    def denied(path, *args, **kwargs):  # what another user's process gives without CAP_SYS_PTRACE
        if str(path).endswith("/environ"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(attribution, "open", denied, raising=False)
    assert attribute(pid, tmp_path, USERS) == identity(
        job=f"k8s-pod:{K8S_SYSTEMD_UID}", kind="kubernetes", pod_uid=K8S_SYSTEMD_UID,
        container_id=K8S_SYSTEMD_CID, cgroup=recorded("k8s-systemd.cgroup")[3:-1])


def test_a_process_that_tells_nothing_is_unknown_but_present(tmp_path):
    pid = fake_proc(tmp_path, cgroup=None, status=None)
    assert attribute(pid, tmp_path, USERS) == identity(job=None, kind="unknown", user=None, cgroup=None)


def test_malformed_files_give_what_can_be_parsed(tmp_path):
    cgroup = "garbage\n7:memory\n::\n3:cpu:relative/path\n0::/system.slice/vllm-server.service\n\x00\xff\n"
    pid = fake_proc(tmp_path, cgroup=cgroup, status="Uid:\tnot-a-number\n",
                    env=["no-equals-sign", "=novalue"])
    assert attribute(pid, tmp_path, USERS) == identity(
        job="vllm-server.service", kind="systemd", user=None, cgroup="/system.slice/vllm-server.service")


def test_hostile_label_is_sanitised_and_bounded(tmp_path):
    hostile = 'prod"\n} evil{job="x' + "A" * 10_240
    pid = fake_proc(tmp_path, env=["KERNELFLEET_JOB=" + hostile])
    got = attribute(pid, tmp_path, USERS)
    assert got.job == "prod____evil_job=_x" + "A" * 109
    assert len(got.job) == 128


def test_hostile_kubernetes_names_are_sanitised(tmp_path):
    pid = fake_proc(tmp_path, cgroup="k8s-systemd.cgroup",
                    env=["POD_NAMESPACE=ns\x1b[31m", "HOSTNAME=" + "é" * 200,
                         "POD_NAMESPACE=second-is-ignored"])
    got = attribute(pid, tmp_path, USERS)
    assert (got.kubernetes_namespace, got.kubernetes_pod_name) == ("ns__31m", "_" * 128)
    assert got.job == "k8s:ns__31m/" + "_" * 116


def test_empty_label_falls_through(tmp_path):
    pid = fake_proc(tmp_path, cgroup="docker.cgroup", env=["KERNELFLEET_JOB= \t"])
    assert attribute(pid, tmp_path, USERS).job == "docker:c4f5c445018e"


@pytest.mark.parametrize("pid", [0, -1, True, "123", 1.5])
def test_a_bad_pid_is_a_usage_error(tmp_path, pid):
    with pytest.raises(UsageError, match="positive integer PID"):
        attribute(pid, tmp_path, USERS)


# --- sharing one GPU ----------------------------------------------------------------------------

@pytest.mark.parametrize("sm, shares", [
    ({}, {}),
    ({7: None}, {7: 1.0}),
    ({7: 0.0}, {7: 1.0}),
    ({7: 55.0}, {7: 1.0}),
    ({1: 30.0, 2: 10.0}, {1: 0.75, 2: 0.25}),
    ({1: 60.0, 2: None, 3: 20.0}, {1: 0.75, 2: 0.0, 3: 0.25}),
    ({1: None, 2: None, 3: None}, {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}),
    ({1: 0.0, 2: 0.0}, {1: 0.5, 2: 0.5}),
    ({1: float("nan"), 2: -5.0, 3: 0.0, 4: None}, {1: 0.25, 2: 0.25, 3: 0.25, 4: 0.25}),
    ({1: 40.0, 2: float("inf")}, {1: 1.0, 2: 0.0}),
])
def test_split_shared(sm, shares):
    assert split_shared(sm) == shares
