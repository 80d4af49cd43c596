"""The roofline pieces of the cost model: a device's capability and the fit of one launch.

Everything is in the log domain (la = log a, -inf for a = 0) so that a fit is additions and
its error is relative. ``costmodel.py`` explains the model; this module solves, for one launch,

    minimise  sum_d (max(la + lc_d, lb + lm_d) - ly_d)^2  +  PRIOR_WEIGHT * R(la, lb)

where lc_d = log c_d (the roofline compute time at efficiency 1), lm_d = log m_d, ly_d the log
of the measured time less the overhead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import field_validator

from kernelfleet.catalog.model import PRECISIONS, Sku
from kernelfleet.documents import Rate, model, validate

PRIOR_WEIGHT = 0.1  # lambda of a "sides" prior: weak, it breaks ties and fills what the data leaves open
# lambda of a "ratio" (intensity) prior: weaker still, since a class mixes GEMMs and attention whose
# intensities differ by orders of magnitude, and two measured devices must be able to overrule it
INTENSITY_WEIGHT = 0.01
INF = math.inf

# A prior is ("sides", la0, lb0): each side near a class value; ("ratio", lr): la - lb near lr;
# ("none",): no preference, an unidentified side sits at its envelope.
Prior = tuple


@model("capability", frozen=True)
class Capability:
    """What a device profile can do: dense peak FLOP/s per catalog precision name ("fp32" is
    the CUDA-core rate, used for launches without a precision) and memory bytes/s. From the
    catalog for a SKU (:meth:`from_sku`); from a calibration for an emulated profile."""

    flops_per_second: dict[str, Rate]
    memory_bytes_per_second: Rate
    source: str = "given"

    @field_validator("flops_per_second")
    @classmethod
    def _precisions(cls, flops: dict[str, float]) -> dict[str, float]:
        unknown = [p for p in flops if p not in PRECISIONS]
        if unknown:
            raise ValueError(f"flops_per_second takes precisions {PRECISIONS}, got {unknown[0]!r}")
        return flops

    @classmethod
    def from_sku(cls, sku: Sku) -> Capability:
        """Datasheet dense peaks and bandwidth (catalog/gpus.toml cites the datasheet of each)."""
        return cls(dict(sku.dense_peak_flops), sku.memory_bandwidth_bytes_per_second, f"catalog {sku.key}")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "<capability>") -> Capability:
        """``{"flops_per_second": {"bf16": 3.2e14, "fp32": 6e13}, "memory_bytes_per_second": 1.9e12}``
        (its ``source``, unless it says one: ``where``)."""
        return validate(cls, {"source": where, **doc} if isinstance(doc, Mapping) else doc, where)

    def peak(self, precision: str | None) -> float | None:
        return self.flops_per_second.get(precision or "fp32")


def log_or_minus_inf(x: float) -> float:
    return math.log(x) if x > 0 else -INF


def fit_launch(
    lc: list[float], lm: list[float], ly: list[float], order: list[int], prior: Prior
) -> tuple[float, float, tuple[str, ...], float, float]:
    """(la, lb, identified sides, data error, data + weighted prior) for one launch.

    ``order`` lists the devices by c_d / m_d, most compute-heavy first: the devices bound by
    compute in any (a, b) are a prefix of it, so the n + 1 prefixes are every possible split.
    Within a split, la is the mean of ly - lc over the compute-bound devices (lb likewise); a
    side with no device comes from the prior, capped at the envelope min_d (ly_d - lc_d)."""
    if all(x == -INF for x in lc) and all(x == -INF for x in lm):
        return -INF, -INF, (), 0.0, 0.0  # no FLOPs and no bytes: the launch costs its overhead
    env_a = min((y - c for c, y in zip(lc, ly) if c > -INF), default=INF)
    env_b = min((y - m for m, y in zip(lm, ly) if m > -INF), default=INF)
    best: tuple[float, float, float, tuple[str, ...], float] | None = None
    for j in range(len(order) + 1):
        on_c, on_m = order[:j], order[j:]
        if any(lc[d] == -INF for d in on_c) or any(lm[d] == -INF for d in on_m):
            continue
        la = sum(ly[d] - lc[d] for d in on_c) / len(on_c) if on_c else None
        lb = sum(ly[d] - lm[d] for d in on_m) / len(on_m) if on_m else None
        la = _fill(prior, lb, "a") if la is None else la
        lb = _fill(prior, la, "b") if lb is None else lb
        la = min(la, env_a) if env_a < INF else -INF  # env = INF: that side has no work at all
        lb = min(lb, env_b) if env_b < INF else -INF
        data = sum((max(la + c, lb + m) - y) ** 2 for c, m, y in zip(lc, lm, ly))
        total = data + (INTENSITY_WEIGHT if prior[0] == "ratio" else PRIOR_WEIGHT) * _penalty(prior, la, lb)
        if best is None or total < best[0]:
            best = (total, la, lb, (("compute",) if on_c else ()) + (("memory",) if on_m else ()), data)
    assert best is not None  # c and m are each all zero or all positive, and not both all zero
    total, la, lb, sides, data = best
    return la, lb, sides, data, total


def _fill(prior: Prior, other: float, side: str) -> float:
    if prior[0] == "sides":
        return prior[1] if side == "a" else prior[2]
    if prior[0] == "ratio":
        return other + prior[1] if side == "a" else other - prior[1]
    return INF


def _penalty(prior: Prior, la: float, lb: float) -> float:
    if prior[0] == "sides":
        return sum((v - v0) ** 2 for v, v0 in ((la, prior[1]), (lb, prior[2])) if v > -INF)
    if prior[0] == "ratio" and la > -INF and lb > -INF:
        return (la - lb - prior[1]) ** 2
    return 0.0
