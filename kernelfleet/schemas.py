"""The JSON Schemas of kernelfleet's documents, generated from their typed models.

``docs/schemas/`` publishes one file per document (``make schemas`` writes them;
``tests/unit/test_documents.py`` fails when a committed one is stale). This module sits above
the layers whose documents it gathers (the core's and ``profile``'s), so none of them imports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kernelfleet.costs.links
import kernelfleet.costs.table  # noqa: F401  (each module registers its documents)
import kernelfleet.kernels.ir  # noqa: F401
import kernelfleet.kernels.raw  # noqa: F401
import kernelfleet.plan.edgerun  # noqa: F401  (and plan.edges)
import kernelfleet.plan.model  # noqa: F401
import kernelfleet.profile.calibration  # noqa: F401
import kernelfleet.profile.groups  # noqa: F401
from kernelfleet.catalog.schema import catalog_schema
from kernelfleet.documents import adapter, registered

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "docs" / "schemas"
DOCUMENTS: dict[str, type] = registered()
"""Every document class, by schema file stem (``costs``, ``plan``, ...)."""


def schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of every document, by file stem, the TOML catalog's included. A document's
    version key is required and constant (in code it defaults; in a file it must be there)."""
    out = {"catalog": catalog_schema()}
    for stem, cls in DOCUMENTS.items():
        key, version, what, _ = cls.__document__  # type: ignore[attr-defined]
        schema = adapter(cls).json_schema()
        schema["required"] = [key] + [name for name in schema.get("required", []) if name != key]
        schema["properties"][key] = {"const": version, "description": f"format version of the {what}"}
        out[stem] = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return dict(sorted(out.items()))


def schema_files() -> dict[str, str]:
    """The text of each file under ``docs/schemas/``, by name (``costs.schema.json``, ...)."""
    return {f"{stem}.schema.json": json.dumps(schema, indent=1, sort_keys=True) + "\n"
            for stem, schema in schemas().items()}


def write_schemas(folder: str | Path = SCHEMA_DIR) -> list[Path]:
    """Write :func:`schema_files` into ``folder`` (``make schemas``); the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in schema_files().items():
        (folder / name).write_text(text)
        written.append(folder / name)
    return written
