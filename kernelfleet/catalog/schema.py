"""The TOML schema of ``gpus.toml`` and of user override files, and its merge rule.

One schema serves both files. An override entry whose ``key`` already exists replaces only the
fields it gives (a list or table field is replaced whole); an entry with a new key adds a SKU and
must give every required field. Checks here are about shape (names, types); a SKU's own
invariants are checked when the ``Sku`` is built.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from kernelfleet.catalog.model import PRECISIONS, TENSOR_PIPES, Price, Sku

SCHEMA_VERSION = 1


class SchemaError(ValueError):
    """A catalog document does not fit the schema. The message omits the file; callers add it."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(item) for item in value)


def _is_number_table(value: Any) -> bool:
    return isinstance(value, dict) and all(_is_number(v) for v in value.values())


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


# TOML field -> (type check, what the message calls that type, required for a new SKU).
_FIELDS: dict[str, tuple[Callable[[Any], bool], str, bool]] = {
    "key": (_is_str, "a string", True),
    "name": (_is_str, "a string", True),
    "nvml_names": (_is_str_list, "a list of strings", True),
    "pci_device_ids": (_is_int_list, "a list of integers", False),
    "architecture": (_is_str, "a string", True),
    "compute_capability": (_is_str, "a string like '9.0'", True),
    "sm_count": (_is_int, "an integer", True),
    "max_sm_clock_hertz": (_is_number, "a number", True),
    "reference_clock_hertz": (_is_number, "a number", True),
    "reference_clock_note": (_is_str, "a string", True),
    "dense_peak_flops": (_is_number_table, "a table of precision = number", True),
    "memory_bytes": (_is_int, "an integer", True),
    "memory_bandwidth_bytes_per_second": (_is_number, "a number", True),
    "interconnect": (_is_str, "a string", True),
    # Both directions summed; the name says so because vendors quote either.
    "interconnect_bidirectional_bytes_per_second": (_is_number, "a number", False),
    "tdp_watts": (_is_number, "a number", False),
    "source": (_is_str, "a string", True),
    "price": (_is_table_list, "an array of tables ([[gpu.price]])", False),
    "peak_clock_hertz": (_is_number_table, "a table of precision = number", False),
    "tensor_clock_ratio": (_is_number_table, "a table of pipe = number", False),
    "tensor_clock_evidence": (_is_str, "a string", False),
}
# Fields an older catalog had, and what took their place, so an old override file says what to change.
_RETIRED = {
    "measured_ofu_clock_hertz": "OFU's clock is now per tensor pipe: give tensor_clock_ratio (and "
                                "tensor_clock_evidence) instead, docs/telemetry.md",
    "measured_ofu_clock_evidence": "replaced by tensor_clock_evidence, docs/telemetry.md",
}
REQUIRED_FIELDS: tuple[str, ...] = tuple(name for name, (_, _, required) in _FIELDS.items() if required)
_PRICE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "usd_per_hour": (_is_number, "a number"),
    "provider": (_is_str, "a string"),
    "source": (_is_str, "a string"),
    "date": (_is_str, "an ISO 8601 date string"),
}
_KEY = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def gpu_entries(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``[[gpu]]`` entries of a parsed document, shape-checked field by field.

    Entries are not checked for completeness here: whether a field is required depends on
    whether the entry adds a SKU or updates one (see ``merge``).
    """
    unknown = sorted(set(document) - {"schema_version", "gpu"})
    if unknown:
        raise SchemaError(
            f"unknown top-level key {unknown[0]!r}; expected 'schema_version' and [[gpu]] entries"
        )
    if "schema_version" in document and document["schema_version"] != SCHEMA_VERSION:
        raise SchemaError(
            f"schema_version {document['schema_version']!r} is not supported; expected {SCHEMA_VERSION}"
        )
    entries: list[dict[str, Any]] = document.get("gpu", [])
    if not _is_table_list(entries):
        raise SchemaError("'gpu' must be an array of tables ([[gpu]])")
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"gpu[{index}]"
        if "key" not in entry:
            raise SchemaError(f"{where}: missing required field 'key'")
        _check_fields(entry, where)
        if not _KEY.match(entry["key"]):
            raise SchemaError(f"{where}: key {entry['key']!r} must be lower-case letters, digits and '-'")
        if entry["key"] in seen:
            raise SchemaError(f"{where}: key {entry['key']!r} appears twice in the file")
        seen.add(entry["key"])
    return entries


def _check_fields(entry: Mapping[str, Any], where: str) -> None:
    where = f"{where} ({entry['key']!r})" if isinstance(entry.get("key"), str) else where
    for name, value in entry.items():
        if name in _RETIRED:
            raise SchemaError(f"{where}: field {name!r} is retired: {_RETIRED[name]}")
        if name not in _FIELDS:
            raise SchemaError(f"{where}: unknown field {name!r}")
        check, expected, _ = _FIELDS[name]
        if not check(value):
            raise SchemaError(f"{where}: field {name!r} must be {expected}, got {type(value).__name__}")
    for table in ("dense_peak_flops", "peak_clock_hertz"):
        for precision in entry.get(table, {}):
            if precision not in PRECISIONS:
                raise SchemaError(
                    f"{where}: {table} has unknown precision {precision!r}; "
                    f"expected one of {', '.join(PRECISIONS)}"
                )
    for pipe in entry.get("tensor_clock_ratio", {}):
        if pipe not in TENSOR_PIPES:
            raise SchemaError(f"{where}: tensor_clock_ratio has unknown pipe {pipe!r}; expected one of "
                              f"{', '.join(TENSOR_PIPES)}")
    for number, price in enumerate(entry.get("price", [])):
        for name, value in price.items():
            if name not in _PRICE_FIELDS:
                raise SchemaError(f"{where}: price[{number}]: unknown field {name!r}")
            check, expected = _PRICE_FIELDS[name]
            if not check(value):
                raise SchemaError(f"{where}: price[{number}]: field {name!r} must be {expected}")
        missing = [name for name in _PRICE_FIELDS if name not in price]
        if missing:
            raise SchemaError(f"{where}: price[{number}]: missing required field {missing[0]!r}")


def merge(base: list[dict[str, Any]], overrides: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply override entries to base entries; new keys are appended in file order."""
    merged = {entry["key"]: dict(entry) for entry in base}
    for index, entry in enumerate(overrides):
        key = entry["key"]
        if key in merged:
            merged[key].update(entry)
            continue
        missing = [name for name in REQUIRED_FIELDS if name not in entry]
        if missing:
            raise SchemaError(
                f"gpu[{index}] ({key!r}) adds a new SKU but is missing required field {missing[0]!r}"
            )
        merged[key] = dict(entry)
    return list(merged.values())


def to_sku(entry: Mapping[str, Any]) -> Sku:
    """Build a ``Sku`` from a complete, shape-checked entry."""
    try:
        return Sku(
            key=entry["key"],
            name=entry["name"],
            nvml_names=tuple(entry["nvml_names"]),
            pci_device_ids=tuple(entry.get("pci_device_ids", ())),
            architecture=entry["architecture"],
            compute_capability=entry["compute_capability"],
            sm_count=entry["sm_count"],
            max_sm_clock_hertz=float(entry["max_sm_clock_hertz"]),
            reference_clock_hertz=float(entry["reference_clock_hertz"]),
            reference_clock_note=entry["reference_clock_note"],
            dense_peak_flops={p: float(v) for p, v in entry["dense_peak_flops"].items()},
            memory_bytes=entry["memory_bytes"],
            memory_bandwidth_bytes_per_second=float(entry["memory_bandwidth_bytes_per_second"]),
            interconnect=entry["interconnect"],
            interconnect_bytes_per_second=_optional_float(
                entry.get("interconnect_bidirectional_bytes_per_second")
            ),
            tdp_watts=_optional_float(entry.get("tdp_watts")),
            source=entry["source"],
            prices=tuple(
                Price(float(p["usd_per_hour"]), p["provider"], p["source"], p["date"])
                for p in entry.get("price", ())
            ),
            peak_clock_hertz={p: float(v) for p, v in entry.get("peak_clock_hertz", {}).items()},
            tensor_clock_ratio={p: float(v) for p, v in entry.get("tensor_clock_ratio", {}).items()},
            tensor_clock_evidence=entry.get("tensor_clock_evidence"),
        )
    except (ValueError, TypeError) as error:
        raise SchemaError(f"gpu {entry['key']!r}: {error}") from None


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)
