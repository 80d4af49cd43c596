"""The catalog's records: a GPU SKU and a price, as validated plain data.

A ``Sku`` checks its own invariants when built (positive numbers, known precision names, a
reference clock no faster than the maximum clock), so a SKU made in code is as trustworthy as
one read from ``gpus.toml``. It raises ``ValueError`` (``TypeError`` for a wrong type) naming the
field; the loader turns that into a ``UsageError`` that also names the file.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import UsageError

PRECISIONS: tuple[str, ...] = ("fp64", "fp64_tensor", "tf32", "bf16", "fp16", "fp8", "int8", "fp4", "fp32")
"""Every precision the catalog knows. ``fp64`` and ``fp32`` are the non-tensor (CUDA-core) rates."""

TENSOR_PRECISIONS: tuple[str, ...] = tuple(p for p in PRECISIONS if p not in ("fp64", "fp32"))
"""Precisions that run on the tensor cores, i.e. the ones OFU (tensor-pipe activity) speaks about."""

TENSOR_PIPES: tuple[str, ...] = ("hmma", "imma", "dfma")
"""The tensor pipes NVML GPM reports a busy fraction for (``HMMA/IMMA/DFMA_TENSOR_UTIL``)."""

PIPE_OF_PRECISION: Mapping[str, str] = types.MappingProxyType({
    "tf32": "hmma", "bf16": "hmma", "fp16": "hmma", "fp8": "hmma", "int8": "imma", "fp64_tensor": "dfma",
})
"""The GPM pipe each tensor precision's work counts in. fp8 counts as HMMA (GPM has no fp8 split,
DESIGN.md Facts). fp4 is left out: no GPU we measured runs it, so no pipe is claimed for it."""

DEFAULT_PIPE = "hmma"
"""The pipe OFU normalises by when a window says only that *some* tensor pipe was busy (GPM
``ANY_TENSOR_UTIL`` without the per-pipe split, DCGM's PIPE_TENSOR_ACTIVE): nearly all AI work is
HMMA-pipe work (fp16, bf16, tf32, fp8)."""

# ISO 8601 calendar date at year, month or day precision: a price quoted "2026-04" is honest
# about knowing only the month.
_ISO_DATE = re.compile(r"^\d{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?)?$")
_COMPUTE_CAPABILITY = re.compile(r"^\d+\.\d+$")


def _positive(name: str, value: float) -> None:
    # bool is an int subclass; a TOML `true` must not pass as the number 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _text(name: str, value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string")


@dataclass(frozen=True)
class Price:
    """One public price for one GPU of a SKU, in US dollars per GPU-hour."""

    usd_per_hour: float
    provider: str
    source: str
    date: str  # ISO 8601: YYYY, YYYY-MM or YYYY-MM-DD

    def __post_init__(self) -> None:
        _positive("usd_per_hour", self.usd_per_hour)
        _text("provider", self.provider)
        _text("source", self.source)
        if not isinstance(self.date, str) or not _ISO_DATE.match(self.date):
            raise ValueError(f"date must be ISO 8601 (YYYY, YYYY-MM or YYYY-MM-DD), got {self.date!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "usd_per_hour": self.usd_per_hour,
            "provider": self.provider,
            "source": self.source,
            "date": self.date,
        }


@dataclass(frozen=True)
class Sku:
    """What one GPU model can do, with the source of every number.

    ``dense_peak_flops`` holds the datasheet's dense (never sparse) peak per precision, in
    FLOP/s (ops/s for int8). A precision the GPU lacks is absent, never 0. For the tensor
    precisions the peak is defined at ``reference_clock_hertz``; where a datasheet quotes a rate
    at another clock (H100/H200: FP64, FP64 tensor and FP32 at the 1.98 GHz boost),
    ``peak_clock_hertz`` holds that clock for that precision and ``reference_clock_note`` shows
    the arithmetic.

    OFU normalises tensor-pipe activity by clock, ``OFU = tensor_active x f_SM / f_ref``, with
    ``f_ref = peak clock / tensor_clock_ratio[pipe]`` (:meth:`ofu_reference_clock`).
    ``tensor_clock_ratio`` is measured, per GPM tensor pipe: the SM cycles that elapse per cycle
    of the SM clock NVML reports while that pipe works (on the H200, 0.903 for HMMA-pipe GEMMs
    and 0.995 for DMMA, counted by a probe kernel; ``tensor_clock_evidence`` says how). Where
    nothing was measured the ratio is 1: NVML's clock is taken at its word.
    ``interconnect_bytes_per_second`` is the GPU's fastest GPU-to-GPU link, both directions
    summed, as NVIDIA quotes it (NVLink 4: 900 GB/s).
    """

    key: str
    name: str
    nvml_names: tuple[str, ...]
    pci_device_ids: tuple[int, ...]
    architecture: str
    compute_capability: str
    sm_count: int
    max_sm_clock_hertz: float
    reference_clock_hertz: float
    reference_clock_note: str
    dense_peak_flops: Mapping[str, float]
    memory_bytes: int
    memory_bandwidth_bytes_per_second: float
    interconnect: str
    interconnect_bytes_per_second: float | None
    tdp_watts: float | None
    source: str
    prices: tuple[Price, ...] = field(default=())
    # Precisions whose datasheet peak is defined at a clock other than reference_clock_hertz.
    peak_clock_hertz: Mapping[str, float] = field(default_factory=dict)
    # Measured SM cycles per NVML clock cycle while a GPM tensor pipe works (DESIGN.md: "settle
    # it by measurement, per SKU"), with the evidence; an absent pipe is taken as 1.
    tensor_clock_ratio: Mapping[str, float] = field(default_factory=dict)
    tensor_clock_evidence: str | None = None

    def __post_init__(self) -> None:
        # Normalise containers so the record is immutable whatever the caller passed.
        object.__setattr__(self, "nvml_names", tuple(self.nvml_names))
        object.__setattr__(self, "pci_device_ids", tuple(self.pci_device_ids))
        object.__setattr__(self, "prices", tuple(self.prices))
        for name in ("dense_peak_flops", "peak_clock_hertz", "tensor_clock_ratio"):
            object.__setattr__(self, name, types.MappingProxyType(dict(getattr(self, name))))
        self._validate()

    def _validate(self) -> None:
        for name in ("key", "name", "architecture", "reference_clock_note", "interconnect", "source"):
            _text(name, getattr(self, name))
        for nvml_name in self.nvml_names:
            _text("nvml_names entry", nvml_name)
        for pci_id in self.pci_device_ids:
            if isinstance(pci_id, bool) or not isinstance(pci_id, int) or not 0 < pci_id <= 0xFFFF:
                raise ValueError(f"pci_device_ids entries must be 16-bit device ids, got {pci_id!r}")
        if not isinstance(self.compute_capability, str) or not _COMPUTE_CAPABILITY.match(
            self.compute_capability
        ):
            raise ValueError(f"compute_capability must look like '9.0', got {self.compute_capability!r}")
        for name in ("sm_count", "memory_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
            _positive(name, value)
        for name in ("max_sm_clock_hertz", "reference_clock_hertz", "memory_bandwidth_bytes_per_second"):
            _positive(name, getattr(self, name))
        for name in ("interconnect_bytes_per_second", "tdp_watts"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        self._validate_clocks()
        # Equal is allowed: on some SKUs the datasheet peak is defined at the top boost clock.
        if self.reference_clock_hertz > self.max_sm_clock_hertz:
            raise ValueError(
                f"reference_clock_hertz {self.reference_clock_hertz:g} exceeds "
                f"max_sm_clock_hertz {self.max_sm_clock_hertz:g}"
            )
        for precision, flops in self.dense_peak_flops.items():
            if precision not in PRECISIONS:
                raise ValueError(
                    f"dense_peak_flops has unknown precision {precision!r}; expected one of "
                    f"{', '.join(PRECISIONS)}"
                )
            _positive(f"dense_peak_flops.{precision}", flops)
        for price in self.prices:
            if not isinstance(price, Price):
                raise TypeError(f"prices entries must be Price, got {type(price).__name__}")

    def _validate_clocks(self) -> None:
        for precision, hertz in self.peak_clock_hertz.items():
            if precision not in PRECISIONS:
                raise ValueError(f"peak_clock_hertz has unknown precision {precision!r}; expected one of "
                                 f"{', '.join(PRECISIONS)}")
            _positive(f"peak_clock_hertz.{precision}", hertz)
            if hertz > self.max_sm_clock_hertz:
                raise ValueError(f"peak_clock_hertz.{precision} {hertz:g} exceeds max_sm_clock_hertz "
                                 f"{self.max_sm_clock_hertz:g}")
        for pipe, ratio in self.tensor_clock_ratio.items():
            if pipe not in TENSOR_PIPES:
                raise ValueError(f"tensor_clock_ratio has unknown pipe {pipe!r}; expected one of {', '.join(TENSOR_PIPES)}")
            _positive(f"tensor_clock_ratio.{pipe}", ratio)
            # A ratio is a measured slowdown; well above 1 is a unit slip (MHz for a ratio), not a GPU.
            if ratio > 1.1:
                raise ValueError(f"tensor_clock_ratio.{pipe} must be near or below 1 (SM cycles per NVML clock "
                                 f"cycle), got {ratio!r}")
        if bool(self.tensor_clock_ratio) != (self.tensor_clock_evidence is not None):
            raise ValueError("tensor_clock_ratio and tensor_clock_evidence come together")
        if self.tensor_clock_evidence is not None:
            _text("tensor_clock_evidence", self.tensor_clock_evidence)
        # One f_ref per pipe: the precisions a pipe runs must have their peaks at one clock.
        for pipe in TENSOR_PIPES:
            clocks = {self.peak_clock(p) for p, q in PIPE_OF_PRECISION.items() if q == pipe and p in self.dense_peak_flops}
            if len(clocks) > 1:
                raise ValueError(f"the {pipe} precisions have peaks at different clocks "
                                 f"({', '.join(f'{c:g}' for c in sorted(clocks))}): OFU would have no one f_ref")

    # The mapping proxy is unhashable, so the generated field-wise hash would fail; equal SKUs
    # share a key, which makes the key a valid hash.
    def __hash__(self) -> int:
        return hash(self.key)

    def peak_clock(self, precision: str) -> float:
        """The clock, in hertz, at which the datasheet defines ``precision``'s peak."""
        return self.peak_clock_hertz.get(precision, self.reference_clock_hertz)

    def ofu_reference_clock(self, pipe: str = DEFAULT_PIPE) -> tuple[float, str]:
        """f_ref for OFU on one GPM tensor pipe, in hertz, and its basis ("measured" or "datasheet").

        Achieved FLOP/s = busy fraction x SMs x FLOP per busy cycle x f_true, where f_true, the
        rate SM cycles really elapse at, is ``tensor_clock_ratio[pipe]`` x the clock NVML reports;
        the peak is SMs x FLOP per cycle x the peak clock. So ``OFU x peak = FLOP/s`` needs
        ``f_ref = peak clock / ratio``: on the H200 1830 / 0.903 = 2027 MHz for HMMA-pipe work.
        """
        if pipe not in TENSOR_PIPES:
            raise UsageError(f"unknown tensor pipe {pipe!r}: expected one of {', '.join(TENSOR_PIPES)}")
        mine = [p for p, q in PIPE_OF_PRECISION.items() if q == pipe and p in self.dense_peak_flops]
        clock = self.peak_clock(mine[0]) if mine else self.reference_clock_hertz
        ratio = self.tensor_clock_ratio.get(pipe)
        return (clock, "datasheet") if ratio is None else (clock / ratio, "measured")

    def ofu_reference_clock_of(self, precision: str) -> tuple[float, str]:
        """f_ref for OFU when the precision that ran is known: its pipe's (its own peak clock if it has none)."""
        if precision not in PRECISIONS:
            raise UsageError(f"unknown precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        pipe = PIPE_OF_PRECISION.get(precision)
        return self.ofu_reference_clock(pipe) if pipe else (self.peak_clock(precision), "datasheet")

    @property
    def ofu_clock_hertz(self) -> float:
        """f_ref of the default (HMMA) pipe: what OFU divides by when a window does not say which pipe ran."""
        return self.ofu_reference_clock()[0]

    def peak_flops(self, precision: str) -> float | None:
        """Dense peak FLOP/s for ``precision``, or None if this GPU does not support it.

        Raises ``UsageError`` for a precision name the catalog does not know, so a typo is
        never mistaken for "unsupported".
        """
        if precision not in PRECISIONS:
            raise UsageError(f"unknown precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        return self.dense_peak_flops.get(precision)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; keys are the attribute names."""
        return {
            "key": self.key,
            "name": self.name,
            "nvml_names": list(self.nvml_names),
            "pci_device_ids": list(self.pci_device_ids),
            "architecture": self.architecture,
            "compute_capability": self.compute_capability,
            "sm_count": self.sm_count,
            "max_sm_clock_hertz": self.max_sm_clock_hertz,
            "reference_clock_hertz": self.reference_clock_hertz,
            "reference_clock_note": self.reference_clock_note,
            # In PRECISIONS order, so two dumps of one catalog diff cleanly.
            "dense_peak_flops": {
                p: self.dense_peak_flops[p] for p in PRECISIONS if p in self.dense_peak_flops
            },
            "memory_bytes": self.memory_bytes,
            "memory_bandwidth_bytes_per_second": self.memory_bandwidth_bytes_per_second,
            "interconnect": self.interconnect,
            "interconnect_bytes_per_second": self.interconnect_bytes_per_second,
            "tdp_watts": self.tdp_watts,
            "source": self.source,
            "prices": [price.to_dict() for price in self.prices],
            "peak_clock_hertz": {p: self.peak_clock_hertz[p] for p in PRECISIONS if p in self.peak_clock_hertz},
            "tensor_clock_ratio": {p: self.tensor_clock_ratio[p] for p in TENSOR_PIPES if p in self.tensor_clock_ratio},
            "tensor_clock_evidence": self.tensor_clock_evidence,
        }


def normalise_nvml_name(name: str) -> str:
    """The form NVML names are compared in: case-folded, runs of whitespace made one space."""
    return " ".join(name.split()).casefold()
