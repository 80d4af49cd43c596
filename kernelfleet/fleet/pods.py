"""A GPU's Kubernetes holders as kernelfleet jobs: containers of one workload (:func:`owner`) are one
job, and each job's series carry the namespace, pod and container that hold the GPU."""

from __future__ import annotations

from collections.abc import Sequence

from kernelfleet.fleet.attribution import clean
from kernelfleet.fleet.owners import owner
from kernelfleet.fleet.reading import JobShare
from kernelfleet.telemetry.sample import Sample
from kernelfleet.telemetry.scrape import PodRef


def job_id(ref: PodRef) -> str:
    """``k8s:<namespace>/<workload>``: the API server's answer where it gave one, else the name rule."""
    return clean(f"k8s:{ref.namespace}/{ref.workload or owner(ref.pod)}")


def pod_jobs(refs: Sequence[PodRef]) -> tuple[JobShare, ...]:
    """One GPU's holders as jobs: containers of one workload are one job; a GPU several jobs
    time-share is split equally among them (the kubelet does not say who used it more)."""
    by_job: dict[str, list[PodRef]] = {}
    for ref in refs:
        by_job.setdefault(job_id(ref), []).append(ref)
    shared = len(by_job) > 1
    out = []
    for job, held in sorted(by_job.items()):
        one = held[0] if len(held) == 1 else None  # a job's several containers on one GPU: no single name
        out.append(JobShare(job, "kubernetes", None, 1.0 / len(by_job), shared,
                            namespace=clean(held[0].namespace), pod=clean(one.pod) if one else None,
                            container=clean(one.container) if one and one.container else None))
    return tuple(out)


def sample_holders(holders: dict[str, tuple[PodRef, ...]], sample: Sample) -> tuple[PodRef, ...]:
    """The containers the kubelet allocated this GPU (or MIG instance) to: by UUID, the sample's own
    for a MIG instance too, or by index where the device plugin names GPUs by index."""
    found = holders.get(sample.uuid)
    if found is None and sample.mig_instance is None:
        found = holders.get(str(sample.gpu_index))
    return found or ()
