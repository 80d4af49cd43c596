"""The TOML schema of ``gpus.toml`` and of user override files, and its merge rule.

One schema serves both files: :class:`CatalogFile`, typed (pydantic, strict: a string is no
number, ``true`` is no integer), whose JSON Schema is ``docs/schemas/catalog.schema.json``. An
override entry whose ``key`` already exists replaces only the fields it gives (a list or table
field is replaced whole); an entry with a new key adds a SKU and must give every field of
:data:`REQUIRED_FIELDS`. Checks here are about shape (names, types); a SKU's own invariants are
checked when the ``Sku`` is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, TypeAdapter, ValidationError
from typing_extensions import Required, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from kernelfleet.catalog.model import PRECISIONS, TENSOR_PIPES, Price, Sku

SCHEMA_VERSION = 1
_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
_KEY = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Fields an older catalog had, and what took their place, so an old override file says what to change.
_RETIRED = {
    "measured_ofu_clock_hertz": "OFU's clock is now per tensor pipe: give tensor_clock_ratio (and "
                                "tensor_clock_evidence) instead, docs/telemetry.md",
    "measured_ofu_clock_evidence": "replaced by tensor_clock_evidence, docs/telemetry.md",
}
# What a message calls a value: by the field, where its type is more than one word, else by the error.
_TABLES = {"nvml_names": "a list of strings", "pci_device_ids": "a list of integers",
           "dense_peak_flops": "a table of precision = number", "peak_clock_hertz": "a table of precision = number",
           "tensor_clock_ratio": "a table of pipe = number", "price": "an array of tables ([[gpu.price]])",
           "gpu": "an array of tables ([[gpu]])"}
_WORDS = {"int_type": "an integer", "float_type": "a number", "finite_number": "a finite number",
          "string_type": "a string", "list_type": "a list", "dict_type": "a table"}


class SchemaError(ValueError):
    """A catalog document does not fit the schema. The message omits the file; callers add it."""


class PriceEntry(TypedDict):
    """One ``[[gpu.price]]``: an hourly price, who charges it, where it was read and when."""

    __pydantic_config__ = _STRICT  # type: ignore[misc]
    usd_per_hour: float
    provider: str
    source: str
    date: str  # ISO 8601, checked when the Sku is built


def _key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"key {key!r} must be lower-case letters, digits and '-'")
    return key


class GpuEntry(TypedDict, total=False):
    """One ``[[gpu]]``: every field but ``key`` may be left out of an override of a known SKU."""

    __pydantic_config__ = _STRICT  # type: ignore[misc]
    key: Required[Annotated[str, AfterValidator(_key)]]
    name: str
    nvml_names: list[str]
    pci_device_ids: list[int]
    architecture: str
    compute_capability: str  # like "9.0"
    sm_count: int
    max_sm_clock_hertz: float
    reference_clock_hertz: float
    reference_clock_note: str
    dense_peak_flops: dict[str, float]  # precision -> FLOP/s
    memory_bytes: int
    memory_bandwidth_bytes_per_second: float
    interconnect: str
    # Both directions summed; the name says so because vendors quote either.
    interconnect_bidirectional_bytes_per_second: float
    tdp_watts: float
    source: str
    price: list[PriceEntry]
    peak_clock_hertz: dict[str, float]  # precision -> the clock its peak is quoted at, where not the reference
    tensor_clock_ratio: dict[str, float]  # tensor pipe -> measured SM cycles per pipe cycle
    tensor_clock_evidence: str


REQUIRED_FIELDS: tuple[str, ...] = (
    "key", "name", "nvml_names", "architecture", "compute_capability", "sm_count", "max_sm_clock_hertz",
    "reference_clock_hertz", "reference_clock_note", "dense_peak_flops", "memory_bytes",
    "memory_bandwidth_bytes_per_second", "interconnect", "source")
"""What an entry that adds a SKU must give."""


def _not_retired(entry: Any) -> Any:
    for name in _RETIRED:
        if isinstance(entry, Mapping) and name in entry:
            raise ValueError(f"field {name!r} is retired: {_RETIRED[name]}")
    return entry


def _known_names(entry: GpuEntry) -> GpuEntry:
    for table in ("dense_peak_flops", "peak_clock_hertz"):
        for precision in entry.get(table, {}):
            if precision not in PRECISIONS:
                raise ValueError(f"{table} has unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    for pipe in entry.get("tensor_clock_ratio", {}):
        if pipe not in TENSOR_PIPES:
            raise ValueError(f"tensor_clock_ratio has unknown pipe {pipe!r}; expected one of {', '.join(TENSOR_PIPES)}")
    return entry


def _unique_keys(entries: list[GpuEntry]) -> list[GpuEntry]:
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        if entry["key"] in seen:
            raise ValueError(f"gpu[{index}] ({entry['key']!r}): key {entry['key']!r} appears twice in the file")
        seen.add(entry["key"])
    return entries


def _supported(version: int) -> int:
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema_version {version!r} is not supported; expected {SCHEMA_VERSION}")
    return version


class CatalogFile(TypedDict, total=False):
    """A GPU catalog file (TOML): an optional ``schema_version`` and its ``[[gpu]]`` entries."""

    __pydantic_config__ = _STRICT  # type: ignore[misc]
    schema_version: Annotated[int, AfterValidator(_supported)]
    gpu: Annotated[list[Annotated[GpuEntry, BeforeValidator(_not_retired), AfterValidator(_known_names)]],
                   AfterValidator(_unique_keys)]


_FILE = TypeAdapter(CatalogFile)


def catalog_schema() -> dict[str, Any]:
    """The JSON Schema of a catalog file (TOML, read as the equivalent JSON)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **_FILE.json_schema()}


def gpu_entries(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``[[gpu]]`` entries of a parsed document, shape-checked field by field.

    Entries are not checked for completeness here: whether a field is required depends on
    whether the entry adds a SKU or updates one (see ``merge``).
    """
    try:
        return list(_FILE.validate_python(document).get("gpu", []))  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SchemaError(_message(exc, document)) from None


def _message(exc: ValidationError, document: Mapping[str, Any]) -> str:
    """The first error as the catalog says it: ``gpu[0] ('t4'): field 'sm_count' must be an integer,
    got str``; inside a list or table, the item's path and what it should be follow in brackets."""
    error = exc.errors(include_url=False)[0]
    loc, kind = list(error["loc"]), error["type"]
    where = ""
    if len(loc) >= 2 and loc[0] == "gpu" and isinstance(loc[1], int):
        entry = document["gpu"][loc[1]]
        key = entry.get("key") if isinstance(entry, Mapping) else None
        where = f"gpu[{loc[1]}]" + (f" ({key!r})" if isinstance(key, str) else "") + ": "
        loc = loc[2:]
        if len(loc) >= 3 and loc[0] == "price" and isinstance(loc[1], int):
            where, loc = f"{where}price[{loc[1]}]: ", loc[2:]
    if kind == "value_error":
        return where + str(error["ctx"]["error"])
    name = str(loc[0]) if loc else "gpu"
    if kind == "missing":
        return f"{where}missing required field {name!r}"
    if kind == "extra_forbidden":
        if not where:
            return f"unknown top-level key {name!r}; expected 'schema_version' and [[gpu]] entries"
        return f"{where}unknown field {name!r}"
    words = _WORDS.get(kind, error["msg"])
    inside = f" ({'.'.join(str(part) for part in loc[1:])}: {words})" if len(loc) > 1 else ""
    return f"{where}field {name!r} must be {_TABLES.get(name, words)}, got {type(error['input']).__name__}{inside}"


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
