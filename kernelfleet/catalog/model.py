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
    precisions the peak is defined at ``reference_clock_hertz``; OFU uses that clock to
    normalise tensor-pipe activity (``OFU = tensor_active x f_SM / f_ref``). Where a datasheet
    quotes a non-tensor or FP64 rate at a different clock, ``reference_clock_note`` says so.
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
    # The clock OFU divides by when a measurement settled it (DESIGN.md: "settle it by
    # measurement, per SKU"), with the evidence; None means the datasheet clock above.
    measured_ofu_clock_hertz: float | None = None
    measured_ofu_clock_evidence: str | None = None

    def __post_init__(self) -> None:
        # Normalise containers so the record is immutable whatever the caller passed.
        object.__setattr__(self, "nvml_names", tuple(self.nvml_names))
        object.__setattr__(self, "pci_device_ids", tuple(self.pci_device_ids))
        object.__setattr__(self, "prices", tuple(self.prices))
        object.__setattr__(self, "dense_peak_flops", types.MappingProxyType(dict(self.dense_peak_flops)))
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
        if (self.measured_ofu_clock_hertz is None) != (self.measured_ofu_clock_evidence is None):
            raise ValueError("measured_ofu_clock_hertz and measured_ofu_clock_evidence come together")
        if self.measured_ofu_clock_hertz is not None:
            _positive("measured_ofu_clock_hertz", self.measured_ofu_clock_hertz)
            _text("measured_ofu_clock_evidence", self.measured_ofu_clock_evidence)  # type: ignore[arg-type]
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

    # The mapping proxy is unhashable, so the generated field-wise hash would fail; equal SKUs
    # share a key, which makes the key a valid hash.
    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def ofu_clock_hertz(self) -> float:
        """f_ref for OFU: the measured clock where one settled it, else the datasheet's."""
        return self.measured_ofu_clock_hertz or self.reference_clock_hertz

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
            "measured_ofu_clock_hertz": self.measured_ofu_clock_hertz,
            "measured_ofu_clock_evidence": self.measured_ofu_clock_evidence,
        }


def normalise_nvml_name(name: str) -> str:
    """The form NVML names are compared in: case-folded, runs of whitespace made one space."""
    return " ".join(name.split()).casefold()
