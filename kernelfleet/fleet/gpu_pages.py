"""``/api/gpus`` in pages: every GPU's row, a bounded number at a time, in one stable order.

Rows go by (host, GPU index, MIG instance, uuid). A page's ``next_after`` is an opaque cursor, the
key of its last row; the next page is the rows after that key, so a GPU that comes or goes between
two pages moves no other row from one page to the next (an offset would). Both backends page the
same way: the local one over the agent's latest readings, the Prometheus one over a few hosts'
series at a time (prometheus_backend.py).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from kernelfleet.errors import UsageError

DEFAULT_LIMIT = 200  # rows of a page unless asked: 90 kB of JSON
MAX_LIMIT = 1000

Key = tuple[str, int, int, str]  # (host, gpu index, MIG instance or -1, uuid)


class GpuPage(BaseModel):
    """One page of ``/api/gpus``: follow ``next_after`` (as ``?after=``) until it is null."""

    gpus: list[dict[str, Any]]  # a backend's GPU rows (LocalBackend.gpus' fields), in key order
    total: int  # rows of every page together, as the backend counts them now
    limit: int
    next_after: str | None


def key(row: Mapping[str, Any]) -> Key:
    mig = row["mig_instance"]
    return row["host"], row["gpu"], -1 if mig is None else mig, row["uuid"]


def cursor(k: Key) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(k), separators=(",", ":")).encode()).decode().rstrip("=")


def parse(limit: str | None, after: str | None) -> tuple[int, Key | None]:
    """The page's size and where it starts, from the query's text; a UsageError names what came."""
    if limit is None:
        size = DEFAULT_LIMIT
    else:
        try:
            size = int(limit)
        except ValueError:
            raise UsageError(f"limit: expected a whole number of rows from 1 to {MAX_LIMIT}, got {limit!r}") from None
        if not 1 <= size <= MAX_LIMIT:
            raise UsageError(f"limit: expected a whole number of rows from 1 to {MAX_LIMIT}, got {limit!r}")
    if after is None:
        return size, None
    try:
        host, gpu, mig, uuid = json.loads(base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)))
        if not (isinstance(host, str) and isinstance(uuid, str) and type(gpu) is int and type(mig) is int):
            raise ValueError
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise UsageError(f"after: expected the next_after of a page of /api/gpus, got {after[:80]!r}") from None
    return size, (host, gpu, mig, uuid)


def page(rows: Iterable[Mapping[str, Any]], limit: int, after: Key | None, total: int, more: bool = False) -> GpuPage:
    """The first ``limit`` of ``rows`` after ``after``, in key order; ``more``: rows beyond
    ``rows`` exist (a backend that read only some hosts)."""
    ordered = sorted((r for r in rows if after is None or key(r) > after), key=key)
    kept = ordered[:limit]
    last = len(ordered) > limit or more
    return GpuPage(gpus=[dict(r) for r in kept], total=total, limit=limit,
                   next_after=cursor(key(kept[-1])) if last and kept else None)
