"""The workload a Kubernetes pod belongs to, read from the API server (``agent --pod-owners api``).

Pod names say who made a pod by convention (``fleet/owners.py``), but not where a JobSet's name
ends: the pods of one JobSet's replicated jobs ("driver", "workers") look like two workloads. The
pod object says exactly, in its labels and owner references, so with a ServiceAccount allowed to
``get`` pods (``deploy/kubernetes/pod-owners/``: a read-only ClusterRole, nothing else) the agent
asks for each pod it sees once:

* ``jobset.sigs.k8s.io/jobset-name``: the JobSet, whatever replicated job the pod is in;
* ``batch.kubernetes.io/job-name`` (or the older ``job-name``): the Job;
* the controller owner reference: a ReplicaSet (its ``pod-template-hash`` cut off, which names the
  Deployment), a StatefulSet, a DaemonSet, or any other controller, by its name;
* none of these: the pod is its own workload.

One GET per new pod with the pod's ServiceAccount token, HTTPS verified against the cluster's CA,
a 1-s deadline and a 1-MiB body cap (a pod object is a few KB); answers are kept for 10 minutes.
While the server fails, one request a minute tries again and every other pod is answered at once
from its name, so an outage holds a sampling window at most a second a minute.
It is a plain HTTPS GET, so the see half needs no Kubernetes client library. Every failure is
soft: the pod's name rule answers instead, and an outage is logged when it starts and when it ends.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEADLINE_SECONDS = 1.0  # the API server answers a pod GET in milliseconds; the window waits for it
MAX_BODY_BYTES = 1 << 20
KEEP_SECONDS = 600.0  # a pod's owner never changes; the cache only bounds memory as pods come and go
RETRY_SECONDS = 60.0  # after a failure, one request a minute tries again (for any pod): an outage costs a window
# at most DEADLINE_SECONDS a minute
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_LABELS = ("batch.kubernetes.io/job-name", "job-name")


def workload_of(pod: dict[str, Any]) -> str | None:
    """The workload a pod object names (module docstring), or None when it names none."""
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return None
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    for key in (JOBSET_LABEL, *JOB_LABELS):
        if isinstance(labels.get(key), str) and labels[key]:
            return labels[key]
    owners = meta.get("ownerReferences") if isinstance(meta.get("ownerReferences"), list) else []
    controller = next((o for o in owners if isinstance(o, dict) and o.get("controller")), None)
    if controller is None or not isinstance(controller.get("name"), str) or not controller["name"]:
        return None
    name, template = controller["name"], labels.get("pod-template-hash")
    if controller.get("kind") == "ReplicaSet" and isinstance(template, str) and name.endswith(f"-{template}"):
        return name[: -len(template) - 1]  # the Deployment that made the ReplicaSet
    return name


@dataclass
class PodOwners:
    """Asks the API server at ``base_url`` for pods' workloads (module docstring)."""

    base_url: str
    token: Callable[[], str]  # read at each request: the kubelet rotates projected tokens
    context: ssl.SSLContext | None
    clock: Callable[[], float] = time.monotonic
    _known: dict[tuple[str, str], tuple[float, str | None]] = field(default_factory=dict)
    _down: bool = False
    _retry_at: float = 0.0

    @classmethod
    def in_cluster(cls, account: Path = ACCOUNT, environ: dict[str, str] | None = None) -> PodOwners | None:
        """From the pod's own ServiceAccount and the API server's service address; None (one log
        line) outside a pod."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        token, ca = account / "token", account / "ca.crt"
        if not host or not token.is_file() or not ca.is_file():
            log.warning("--pod-owners api: not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST or no ServiceAccount "
                        "token under %s); workloads are read from pod names", account)
            return None
        host = f"[{host}]" if ":" in host else host  # an IPv6 service address
        return cls(f"https://{host}:{port}", lambda: token.read_text().strip(), ssl.create_default_context(cafile=ca))

    def workload(self, namespace: str, pod: str) -> str | None:
        """The pod's workload, or None where the API server did not say (the caller's name rule then)."""
        key, now = (namespace, pod), self.clock()
        if key in self._known and now < self._known[key][0]:
            return self._known[key][1]
        if self._down and now < self._retry_at:
            return None
        if len(self._known) > 4096:  # pods come and go; forget the expired
            self._known = {k: v for k, v in self._known.items() if now < v[0]}
        try:
            found, keep = workload_of(self._get(namespace, pod)), KEEP_SECONDS
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                return self._failed(now, exc)
            found, keep = None, RETRY_SECONDS  # a pod the server does not have (yet, or any more): its name says
        except (OSError, ValueError) as exc:
            return self._failed(now, exc)
        if self._down:
            log.warning("pod owners: the API server answers again")
        self._down = False
        self._known[key] = (now + keep, found)
        return found

    def _failed(self, now: float, exc: Exception) -> None:
        """An outage starts (one log line) or goes on; one request a minute tries again."""
        self._retry_at = now + RETRY_SECONDS
        if not self._down:
            log.warning("pod owners: %s (reading workloads from pod names until the API server answers)", _why(exc))
        self._down = True

    def _get(self, namespace: str, pod: str) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods/{urllib.parse.quote(pod, safe='')}"
        request = urllib.request.Request(self.base_url + path, headers={
            "Authorization": f"Bearer {self.token()}", "Accept": "application/json"})
        deadline = time.monotonic() + DEADLINE_SECONDS
        body = bytearray()
        with urllib.request.urlopen(request, timeout=DEADLINE_SECONDS, context=self.context) as reply:
            # read in pieces against one deadline: a server that drips a byte at a time must not hold a window
            while chunk := reply.read1(65536):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise ValueError(f"the reply for {namespace}/{pod} is over {MAX_BODY_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise ValueError(f"the reply for {namespace}/{pod} took over {DEADLINE_SECONDS:g} s")
        found = json.loads(body)
        if not isinstance(found, dict):
            raise ValueError(f"the reply for {namespace}/{pod} is not a pod object")
        return found


def _why(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        hint = " (the ServiceAccount may not get pods: apply deploy/kubernetes/pod-owners)" if exc.code in (401, 403) \
            else ""
        return f"the API server answered HTTP {exc.code}{hint}"
    return f"cannot read pods from the API server: {exc}"
