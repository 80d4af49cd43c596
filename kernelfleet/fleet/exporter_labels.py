"""Label names of /metrics: kernelfleet's own, or dcgm-exporter's.

A fleet that already charts dcgm-exporter joins on its labels (``Hostname``, ``UUID``,
``modelName``, ``gpu``, ``GPU_I_ID`` for a MIG slice). With ``--label-names dcgm`` the agent
uses those names, and ``modelName`` carries the NVML name as dcgm-exporter does ("NVIDIA H200",
not the catalog key), so ``kernelfleet_ofu_ratio * on(UUID) group_left DCGM_FI_DEV_FB_USED``
needs no ``label_replace``. docs/fleet.md has the join for the default names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.metrics_core import Metric

from kernelfleet.errors import UsageError

LABEL_STYLES = ("kernelfleet", "dcgm")
# kernelfleet label -> dcgm-exporter label (dcgm-exporter's default counters CSV and MIG labels)
DCGM_NAMES = {"uuid": "UUID", "hostname": "Hostname", "model": "modelName", "mig": "GPU_I_ID"}


def check_style(style: str) -> str:
    """``style`` if it is one of :data:`LABEL_STYLES`; a one-line error otherwise."""
    if style not in LABEL_STYLES:
        raise UsageError(f"--label-names must be one of {', '.join(LABEL_STYLES)}, got {style!r}")
    return style


def dcgm_labels(families: Iterable[Metric], model_names: Mapping[str, str]) -> Iterator[Metric]:
    """``families`` with dcgm-exporter's label names; ``model_names`` maps a GPU's uuid to its NVML name."""
    for family in families:
        family.samples = [sample._replace(labels=_renamed(sample.labels, model_names)) for sample in family.samples]
        yield family


def _renamed(labels: dict[str, str], model_names: Mapping[str, str]) -> dict[str, str]:
    out = {DCGM_NAMES.get(k, k): v for k, v in labels.items()}
    if "modelName" in out and "uuid" in labels:
        out["modelName"] = model_names.get(labels["uuid"], out["modelName"])
    return out
