"""Reading the JSON documents kernelfleet writes (programs, cost tables, plans).

Every document names its kind and format version in one key; anything wrong while reading
one — bad JSON, a missing or mistyped field — becomes one UsageError that names the file.
"""

from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from kernelfleet.errors import UsageError


def read_text(path: str | Path, what: str = "text") -> str:
    """The file's text, gunzipped when its name ends in ``.gz``; UsageError naming the file when it
    cannot be read, or is not ``what`` (a gzip stream cut short, bytes that are not UTF-8)."""
    try:
        if str(path).endswith(".gz"):
            return gzip.decompress(Path(path).read_bytes()).decode()
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (EOFError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not {what} ({exc})") from exc


@contextmanager
def reading(where: str, what: str) -> Iterator[None]:
    """Turn any error raised while reading a document into one line naming ``where``."""
    try:
        yield
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{where}: not a {what} ({type(exc).__name__}: {exc})") from exc


def parse(text: str, key: str, version: int) -> dict[str, Any]:
    """The JSON object in ``text``, checked to carry ``key = version``."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get(key) != version:
        raise UsageError(f"expected {key}={version}")
    return doc
