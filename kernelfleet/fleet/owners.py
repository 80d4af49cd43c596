"""The workload that made a Kubernetes pod, from the pod's name alone.

The kubelet's pod-resources API and dcgm-exporter name a GPU's pod, not the workload that made
it, and reading owners from the API server would need a ClusterRole to get pods, replicasets and
jobs on every node. Controllers name their pods by fixed conventions, so the owner is read from
the name (no permission at all):

* ``<name>-<5 chars>``: a generated name (Job, DaemonSet, a ReplicaSet's pod); the 5 characters
  come from the apiserver's alphabet ``bcdfghjklmnpqrstvwxz2456789``;
* before that suffix, ``<deployment>-<pod-template-hash>`` (6 to 10 characters of the same
  alphabet) for a Deployment's pod, or numeric segments: an indexed Job's completion index, a
  JobSet's job index (``<jobset>-<replicated job>-<job index>-<pod index>``), a CronJob's
  schedule time;
* ``<statefulset>-<ordinal>`` without a suffix: a StatefulSet's pod.

So ``train-0-x7k2p`` and ``train-1-9dq4m`` (two pods of the indexed Job ``train``) are the job
``k8s:<namespace>/train``. The rule is a convention, not a lookup: a bare pod whose name ends
like a suffix is grouped with its look-alikes, and a JobSet's replicated jobs stay apart
(``<jobset>-<replicated job>``), since nothing in a name says where the JobSet's name ends.
"""

from __future__ import annotations

import re

# k8s.io/apimachinery/pkg/util/rand: the alphabet of generateName suffixes and SafeEncodeString.
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_GENERATED = re.compile(rf"^(.+)-[{_ALPHABET}]{{5}}$")
_TEMPLATE_HASH = re.compile(rf"^(.+)-[{_ALPHABET}]{{6,10}}$")
_INDEX = re.compile(r"^(.+)-\d+$")


def owner(pod: str) -> str:
    """The workload a pod's name says made it (the pod's own name when it says nothing)."""
    generated = _GENERATED.match(pod)
    if generated is None:
        ordinal = _INDEX.match(pod)
        return ordinal.group(1) if ordinal else pod  # a StatefulSet's pod, or a bare one
    base = generated.group(1)
    if _INDEX.match(base) is None and (template := _TEMPLATE_HASH.match(base)):
        return template.group(1)  # a Deployment's ReplicaSet's pod
    while index := _INDEX.match(base):  # job indexes, a JobSet's job and pod indexes, a CronJob's time
        base = index.group(1)
    return base
