"""Which job a GPU process belongs to, from what /proc says about it.

NVML gives the agent the PIDs on each GPU; this module turns one PID into a
:class:`JobIdentity` by reading ``/proc/<pid>/cgroup``, ``/proc/<pid>/environ``
and ``/proc/<pid>/status`` under a proc root that is passed in. It touches no
device and no network. Precedence of the job id: an opt-in label
(``KERNELFLEET_JOB``), Slurm, Kubernetes, Docker, a systemd service, the user.

The agent must run in the host's PID and cgroup namespaces: from inside a
private cgroup namespace every path is relative and the patterns below do not
match. ``environ`` of other users' processes needs CAP_SYS_PTRACE; without it
the label and the Kubernetes names are lost, cgroup-based attribution is not.
"""

from __future__ import annotations

import functools
import math
import pwd
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from kernelfleet.errors import UsageError
from kernelfleet.fleet.owners import owner

LABEL_MAX_CHARS = 128
# A hostile process can make its environ as large as the stack rlimit allows;
# the variables we want sit in the first few KB of any sane environment.
_READ_MAX_BYTES = 1 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/@+=-]")

# Slurm: cgroup v1 "/slurm[_<node>]/uid_<uid>/job_<id>/step_<s>/task_<t>" (Slurm's
# task/cgroup and proctrack/cgroup plugins); cgroup v2 "/system.slice/
# [<node>_]slurmstepd.scope/job_<id>/step_<s>/user/task_<t>" (cgroup/v2 plugin,
# the node prefix when several slurmd share a host).
_SLURM = re.compile(r"(?:^|/)(?:slurm(?:_[^/]+)?(?:/uid_\d+)?|(?:[^/]+_)?slurmstepd\.scope)/job_(\d+)(?=/|$)")
# Kubelet, cgroupfs driver: "/kubepods[/burstable|/besteffort]/pod<uid>/<cid>"
# (Guaranteed pods have no QoS directory). Systemd driver: "kubepods-burstable-
# pod<uid>.slice" with the uid's dashes escaped as underscores. Static pods have
# a 32-hex config hash as uid, hence no fixed length.
_POD_CGROUPFS = re.compile(r"(?:^|/)kubepods(?:/(?:burstable|besteffort))?/pod([0-9a-f-]+)(?=/|$)")
_POD_SYSTEMD = re.compile(r"(?:^|/)kubepods(?:-(?:burstable|besteffort))?-pod([0-9a-f_]+)\.slice(?=/|$)")
# One path component naming a container: bare (cgroupfs) or a runtime's scope.
# "crio-conmon-<id>.scope" (cri-o's monitor process) deliberately does not match.
_CONTAINER = re.compile(r"(?:docker-|cri-containerd-|crio-)?([0-9a-f]{64})(?:\.scope)?")
# Docker's own cgroups: "/docker/<id>" (cgroupfs driver), "docker-<id>.scope" (systemd driver).
_DOCKER = re.compile(r"(?:^|/)(?:docker/|docker-)([0-9a-f]{64})(?:\.scope)?(?=/|$)")
# A system service, possibly in a sub-slice: "/system.slice/system-getty.slice/getty@tty1.service".
_SERVICE = re.compile(r"^/system\.slice/(?:[^/]+\.slice/)*([^/]+\.service)(?=/|$)")


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """Who a process belongs to. Every string from the process is sanitised (:func:`clean`)."""

    pid: int
    job: str | None  # the job id shown to users; None only when the process is unknown
    kind: str  # "label" | "slurm" | "kubernetes" | "docker" | "systemd" | "user" | "unknown"
    user: str | None  # passwd name of the real uid, or "uid:<n>" without a passwd entry
    kubernetes_pod_uid: str | None
    kubernetes_namespace: str | None
    kubernetes_pod_name: str | None
    container_id: str | None  # 64 hex, docker / containerd / cri-o
    slurm_job_id: str | None
    cgroup: str | None  # the cgroup path the decision came from (diagnostics, not a label)


def clean(value: str, max_chars: int = LABEL_MAX_CHARS) -> str:
    """Make ``value`` safe as a metric label: keep ``[A-Za-z0-9._:/@+=-]``, replace
    anything else (control characters, quotes, spaces, non-ASCII) with ``_``, and cut
    it to ``max_chars`` so a process cannot blow up label size or cardinality."""
    return _UNSAFE.sub("_", value[:max_chars])


@functools.lru_cache(maxsize=1024)
def _passwd_name(uid: int) -> str | None:
    # The agent asks for every GPU process every window; a getpwuid may read /etc/passwd or
    # ask NSS (LDAP, sssd) each time, and a uid's name does not change under a running job.
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _read(path: Path) -> bytes | None:
    # Any OSError means "not available": the process exited (ENOENT, ESRCH), or
    # belongs to another user (EACCES). Attribution degrades, it never raises.
    try:
        with open(path, "rb") as f:
            return f.read(_READ_MAX_BYTES)
    except OSError:
        return None


def _environ(raw: bytes | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in (raw or b"").split(b"\0"):
        key, sep, value = entry.decode("utf-8", "replace").partition("=")
        if sep and key:
            env.setdefault(key, value)  # getenv(3) returns the first of duplicates
    return env


def _real_uid(raw: bytes | None) -> int | None:
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def _cgroup_paths(raw: bytes | None) -> list[str]:
    """Paths in the order we trust them: the unified path on a pure v2 host, else v1
    lines most specific (deepest) first; on a hybrid host the v1 controllers carry the
    job's placement and the unified hierarchy often only systemd's."""
    v2: list[str] = []
    v1: list[str] = []
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue  # malformed line: skip it, keep the rest
        (v2 if parts[0] == "0" and parts[1] == "" else v1).append(parts[2])
    v1.sort(key=lambda p: -len([c for c in p.split("/") if c]))  # stable: file order breaks ties
    return v1 + v2


def _search(paths: list[str], pattern: re.Pattern[str]) -> tuple[str, str] | None:
    for path in paths:
        if m := pattern.search(path):
            return m.group(1), path
    return None


def _container_id(path: str | None) -> str | None:
    # The deepest container-looking component is the container itself (a pod
    # cgroup may hold the sandbox and the app containers side by side).
    for component in reversed((path or "").split("/")):
        if m := _CONTAINER.fullmatch(component):
            return m.group(1)
    return None


def _env_value(env: Mapping[str, str], *keys: str) -> str | None:
    for key in keys:
        value = env.get(key, "").strip()
        if value:
            return clean(value)
    return None


def attribute(
    pid: int,
    proc_root: Path = Path("/proc"),
    user_name: Callable[[int], str | None] = _passwd_name,
) -> JobIdentity:
    """Attribute process ``pid`` to a job, reading ``proc_root/<pid>/{cgroup,environ,status}``.

    Never raises for a missing, unreadable or malformed file: a process that is gone
    gives ``kind="unknown"`` with everything None; an unreadable environ (another
    user's process) is skipped; a malformed file gives what can be parsed.
    ``user_name`` maps a uid to a login name (default: the passwd database, so an
    agent in a container needs the host's /etc/passwd mounted or its own resolver).
    Raises :class:`UsageError` only for a pid that is not a positive integer.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise UsageError(f"attribute() expects a positive integer PID, got {pid!r}")
    base = proc_root / str(pid)
    if not base.is_dir():
        return JobIdentity(pid, None, "unknown", None, None, None, None, None, None, None)

    paths = _cgroup_paths(_read(base / "cgroup"))
    env = _environ(_read(base / "environ"))
    uid = _real_uid(_read(base / "status"))
    user = None if uid is None else clean(user_name(uid) or f"uid:{uid}")

    slurm = _search(paths, _SLURM)
    env_slurm = env.get("SLURM_JOB_ID", "").strip()
    slurm_job_id = slurm[0] if slurm else (env_slurm if env_slurm.isascii() and env_slurm.isdigit() else None)
    slurm_job_id = clean(slurm_job_id) if slurm_job_id else None

    pod = _search(paths, _POD_SYSTEMD)
    pod = (pod[0].replace("_", "-"), pod[1]) if pod else _search(paths, _POD_CGROUPFS)
    docker = _search(paths, _DOCKER)
    service = _search(paths, _SERVICE)

    namespace = pod_name = None
    if pod:
        # Names come from the downward API when the pod spec exports them; HOSTNAME
        # is the pod name unless spec.hostname overrides it (kubelet cuts it to 63).
        namespace = _env_value(env, "POD_NAMESPACE", "KUBERNETES_NAMESPACE")
        pod_name = _env_value(env, "POD_NAME", "HOSTNAME")
    pod_uid = clean(pod[0]) if pod else None

    label = _env_value(env, "KERNELFLEET_JOB")
    decided_by: str | None = None
    if label:
        job, kind = label, "label"
    elif slurm_job_id:
        job, kind = f"slurm-{slurm_job_id}", "slurm"
        decided_by = slurm[1] if slurm else None
    elif pod:
        # One job per workload (a Job's, a Deployment's pods), as with the kubelet's pod names.
        job = f"k8s:{namespace}/{owner(pod_name)}" if namespace and pod_name else f"k8s-pod:{pod_uid}"
        kind, decided_by = "kubernetes", pod[1]
    elif docker:
        job, kind, decided_by = f"docker:{docker[0][:12]}", "docker", docker[1]
    elif service:
        job, kind, decided_by = clean(service[0]), "systemd", service[1]
    elif user:
        job, kind = f"user:{user}", "user"
    else:
        job, kind = None, "unknown"  # the process exists but told us nothing

    cgroup = decided_by or (paths[0] if paths else None)
    container_path = pod[1] if pod else docker[1] if docker else cgroup
    container = _container_id(container_path)
    return JobIdentity(
        pid=pid,
        job=job[:LABEL_MAX_CHARS] if job else None,  # composed ids can outgrow their parts
        kind=kind,
        user=user,
        kubernetes_pod_uid=pod_uid,
        kubernetes_namespace=namespace,
        kubernetes_pod_name=pod_name,
        container_id=container,
        slurm_job_id=slurm_job_id,
        # A full Kubernetes systemd path is ~200 characters: keep it whole, up to PATH_MAX.
        cgroup=clean(cgroup, 4096) if cgroup else None,
    )


def split_shared(gpu_sm_by_pid: Mapping[int, float | None]) -> dict[int, float]:
    """Split one GPU among the processes on it: PID -> share, the shares summing to 1.0.

    Shares follow each process's SM utilisation (NVML's per-process ``smUtil``) where
    it is known and positive; a process whose value is None, negative or not finite
    gets 0.0 when others have a value (NVML reports per-process samples only for
    processes that ran in the window), and an equal split is used when no process has
    a positive value. A single process gets 1.0; an empty mapping gives {}.

    On a time-shared GPU these shares are approximate: NVML samples which context
    is resident, not the work each one did, so they apportion time, not FLOPs.
    """
    if not gpu_sm_by_pid:
        return {}
    known = {
        pid: float(v)
        for pid, v in gpu_sm_by_pid.items()
        if v is not None and math.isfinite(v) and v > 0
    }
    total = math.fsum(known.values())
    if total <= 0:
        return {pid: 1.0 / len(gpu_sm_by_pid) for pid in gpu_sm_by_pid}
    return {pid: known.get(pid, 0.0) / total for pid in gpu_sm_by_pid}
