"""GPU SKUs as data: what each GPU can do, looked up by the name NVML reports or its PCI id.

The numbers live in ``gpus.toml`` beside this file, each SKU citing its datasheet. A user file
(``Catalog.load(override=...)`` or the ``KERNELFLEET_CATALOG`` environment variable) can correct
a number, add a price or add a SKU without touching code; see docs/catalog.md for the format.

An unknown GPU looks up as None: the catalog never lends one GPU's peak to another.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from kernelfleet.catalog.model import PRECISIONS, TENSOR_PRECISIONS, Price, Sku, normalise_nvml_name
from kernelfleet.catalog.notes import same_die_note
from kernelfleet.catalog.schema import SchemaError, gpu_entries, merge, to_sku
from kernelfleet.errors import UsageError

__all__ = ["ENV_VAR", "PRECISIONS", "TENSOR_PRECISIONS", "Catalog", "Price", "Sku", "same_die_note"]

ENV_VAR = "KERNELFLEET_CATALOG"
"""Names an override file, used when ``Catalog.load`` is given none."""

_NVIDIA_VENDOR_ID = 0x10DE


class Catalog:
    """A set of SKUs with lookup by NVML name, PCI device id and catalog key."""

    def __init__(self, skus: Iterable[Sku]) -> None:
        self._skus: dict[str, Sku] = {}
        self._by_name: dict[str, Sku] = {}
        self._by_pci: dict[int, list[Sku]] = {}
        for sku in skus:
            if sku.key in self._skus:
                raise ValueError(f"GPU key {sku.key!r} appears twice")
            self._skus[sku.key] = sku
            for name in sku.nvml_names:
                normalised = normalise_nvml_name(name)
                if normalised in self._by_name:
                    # Two SKUs answering to one name would make lookup a coin toss.
                    first = self._by_name[normalised].key
                    raise ValueError(f"NVML name {name!r} is claimed by both {first!r} and {sku.key!r}")
                self._by_name[normalised] = sku
            for pci_id in sku.pci_device_ids:
                self._by_pci.setdefault(pci_id, []).append(sku)

    @classmethod
    def load(cls, override: str | os.PathLike[str] | None = None) -> Catalog:
        """The built-in catalog, with an override file applied if one is given.

        The override is ``override`` if given, else the file named by ``KERNELFLEET_CATALOG``
        if that is set and non-empty. A bad override raises ``UsageError`` naming the file and
        what is wrong with it; a bad built-in file is a bug and raises ``RuntimeError``.
        """
        builtin = _builtin_document()
        try:
            # Merging into nothing applies the same completeness check as a new SKU gets.
            entries = merge([], gpu_entries(builtin))
            skus = [to_sku(entry) for entry in entries]
            catalog = cls(skus)
        except (SchemaError, ValueError) as error:
            raise RuntimeError(
                f"built-in GPU catalog gpus.toml is invalid (a kernelfleet bug): {error}"
            ) from error
        path, origin = _override_path(override)
        if path is None:
            return catalog
        label = f"GPU catalog override {path}{origin}"
        document = _read_override(path, label)
        try:
            merged = merge(entries, gpu_entries(document))
            return cls(to_sku(entry) for entry in merged)
        except (SchemaError, ValueError) as error:
            raise UsageError(f"{label}: {error}") from None

    def lookup(self, nvml_name: str, pci_device_id: int | None = None) -> Sku | None:
        """The SKU for a GPU as NVML describes it, or None if the catalog does not know it.

        The name (``nvmlDeviceGetName``) is matched exactly, ignoring case and runs of
        whitespace. Failing that, ``pci_device_id`` is tried: either the 16-bit device id
        (0x2330) or NVML's combined ``pciDeviceId`` (0x233010DE). A PCI id shared by several
        SKUs matches none of them.
        """
        sku = self._by_name.get(normalise_nvml_name(nvml_name))
        if sku is not None or pci_device_id is None:
            return sku
        device_id = pci_device_id
        if device_id > 0xFFFF and device_id & 0xFFFF == _NVIDIA_VENDOR_ID:
            device_id >>= 16
        candidates = self._by_pci.get(device_id, [])
        return candidates[0] if len(candidates) == 1 else None

    def get(self, key: str) -> Sku:
        """The SKU with catalog key ``key``; ``UsageError`` listing the known keys if none."""
        try:
            return self._skus[key]
        except KeyError:
            raise UsageError(f"unknown GPU key {key!r}; known keys: {', '.join(self._skus)}") from None

    def __iter__(self) -> Iterator[Sku]:
        return iter(self._skus.values())

    def __len__(self) -> int:
        return len(self._skus)

    def __contains__(self, key: object) -> bool:
        return key in self._skus


def _builtin_document() -> dict[str, Any]:
    text = resources.files(__name__).joinpath("gpus.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _override_path(override: str | os.PathLike[str] | None) -> tuple[Path | None, str]:
    if override is not None:
        return Path(override), ""
    from_env = os.environ.get(ENV_VAR, "")
    if from_env.strip():
        return Path(from_env), f" (from {ENV_VAR})"
    return None, ""


def _read_override(path: Path, label: str) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise UsageError(f"{label}: file not found") from None
    except OSError as error:
        raise UsageError(f"{label}: cannot read it: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{label}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{label}: not valid TOML: {error}") from None
