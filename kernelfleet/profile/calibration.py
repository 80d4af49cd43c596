"""Pick the emulated complementary pair whose ratios come closest to a real pair of GPUs.

A calibration measures, on each candidate profile, a bf16 GEMM (FLOP/s), a bf16 GEMV (bytes/s:
the bandwidth a decode step lives on) and a copy. A real pair from the catalog — the first GPU
compute-rich, the second bandwidth-rich, as L40S against A100 — sets two targets:

    GEMM ratio      = dense bf16 peak(compute GPU) / peak(bandwidth GPU)      (L40S / A100: 1.16)
    bandwidth ratio = memory bytes/s(bandwidth GPU) / bytes/s(compute GPU)    (A100 / L40S: 2.36)

Among candidate (compute profile, bandwidth profile) pairs, the one with the smallest sum of
``|log(measured / target)|`` over the two ratios wins: a pair off by 2x in either direction is
penalised alike. Pure: the measurements come in as rows of a :class:`Calibration` document
(``kernelfleet_calibration``), which ``kernelfleet calibrate`` measures on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from kernelfleet.catalog import Catalog
from kernelfleet.documents import CONFIG, Document, Rate, document
from kernelfleet.errors import UsageError

CALIBRATION_FORMAT = 1


class CalibrationRow(TypedDict):
    """What one device profile measured: a bf16 GEMM, a bf16 GEMV and a copy (``None``: not run).

    ``sms`` is the work partition asked for (None: the whole GPU), ``granted_sms`` what the driver
    gave, ``hog_sms`` the bandwidth hog's partition (None: no hog) and ``hog_bytes_per_second``
    what the hog pulled meanwhile."""

    __pydantic_config__ = CONFIG  # type: ignore[misc]
    name: str
    sms: int | None
    granted_sms: int | None
    hog_sms: int | None
    gemm_flops_per_second: Rate
    gemv_bytes_per_second: Rate
    copy_bytes_per_second: Rate | None
    hog_bytes_per_second: Rate | None


def _unversioned(rows: Any) -> dict[str, Any]:
    """The first calibration files were the bare list of rows."""
    return {"rows": rows}


@document("kernelfleet_calibration", CALIBRATION_FORMAT, "calibration", upgrades={None: _unversioned})
class Calibration(Document):
    """The rows of a calibration sweep (``kernelfleet_calibration``); rows stay dicts, typed. The
    older bare list of rows reads too."""

    rows: list[CalibrationRow]
    DUMP = {"indent": 1}



@dataclass(frozen=True, slots=True)
class PairChoice:
    compute: CalibrationRow  # the calibration row of the compute-rich profile
    bandwidth: CalibrationRow
    gemm_ratio: float  # measured, compute / bandwidth
    bandwidth_ratio: float  # measured GEMV bytes/s, bandwidth / compute
    target_gemm_ratio: float
    target_bandwidth_ratio: float

    @property
    def error(self) -> float:
        return (abs(math.log(self.gemm_ratio / self.target_gemm_ratio))
                + abs(math.log(self.bandwidth_ratio / self.target_bandwidth_ratio)))


def targets(compute_sku: str, bandwidth_sku: str, catalog: Catalog | None = None) -> tuple[float, float]:
    """(GEMM ratio, bandwidth ratio) of a real pair, from datasheet bf16 peaks and memory bandwidth."""
    catalog = catalog or Catalog.load()
    c, b = catalog.get(compute_sku), catalog.get(bandwidth_sku)
    pc, pb = c.peak_flops("bf16"), b.peak_flops("bf16")
    if pc is None or pb is None:
        raise UsageError(f"{compute_sku} or {bandwidth_sku} has no bf16 peak in the catalog")
    return pc / pb, b.memory_bandwidth_bytes_per_second / c.memory_bandwidth_bytes_per_second


def pick_pair(rows: list[CalibrationRow], gemm_target: float, bandwidth_target: float) -> PairChoice:
    """The (compute, bandwidth) pair of calibration rows closest to the targets.

    Rows carry ``gemm_flops_per_second`` and ``gemv_bytes_per_second``; compute candidates are the
    rows with a hog (``hog_sms``), bandwidth candidates the partitions without one.
    """
    computes = [r for r in rows if r.get("hog_sms")]
    bandwidths = [r for r in rows if not r.get("hog_sms") and r.get("sms")]
    if not computes or not bandwidths:
        raise UsageError("calibration needs profiles with a hog and partitions without one")
    choices = [PairChoice(c, b, c["gemm_flops_per_second"] / b["gemm_flops_per_second"],
                          b["gemv_bytes_per_second"] / c["gemv_bytes_per_second"], gemm_target, bandwidth_target)
               for c in computes for b in bandwidths]
    return min(choices, key=lambda choice: choice.error)
