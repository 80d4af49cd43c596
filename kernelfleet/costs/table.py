"""Seconds of each launch on each device, as a document (``kernelfleet_costs``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernelfleet.catalog.model import PRECISIONS
from kernelfleet.documents import parse, reading
from kernelfleet.errors import UsageError

COSTS_FORMAT = 1


@dataclass
class CostTable:
    """Seconds of each launch on each device: ``seconds[launch index][device name]``.

    ``None`` means the launch cannot run there (unsupported), never 0 (STYLE rule 5).
    The optional per-launch lists feed the roofline cost model (``costs/model.py``):
    ``flops`` (useful FLOPs of the launch), ``bytes`` (bytes it moves to and from device
    memory) and ``precision`` (a catalog precision name such as "bf16", "fp32"; None for
    work without a tensor precision). Each entry may be None (unknown); a list that is
    absent is None. Older documents without these keys read as None.
    """

    seconds: list[dict[str, float | None]]
    source: str = "unknown"  # "measured on ...", "roofline model fitted on ...", "synthetic seed 3"
    flops: list[int | None] | None = None
    bytes: list[int | None] | None = None
    precision: list[str | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.seconds)
        for name in ("flops", "bytes", "precision"):
            values = getattr(self, name)
            if values is None:
                continue
            _need(len(values) == n, f"cost table: {name} has {len(values)} entries, seconds has {n} rows")
            for k, value in enumerate(values):
                if name == "precision":
                    _need(value is None or value in PRECISIONS, f"cost table: launch {k} precision must be "
                          f"one of {PRECISIONS} or null, got {value!r}")
                else:
                    _need(value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                                            and value >= 0),
                          f"cost table: launch {k} {name} must be a number >= 0 or null, got {value!r}")

    def faster_than(self, ceiling: dict[str, float]) -> list[tuple[int, str, float]]:
        """(launch, device, FLOP/s) wherever a time implies more FLOP/s than ``ceiling[precision]``
        allows (e.g. the fastest dense peak of any GPU in the catalog): a time that cannot be right,
        such as a kernel that skipped its work when the profiler replayed it."""
        if self.flops is None or self.precision is None:
            return []
        out = []
        for k, (row, flops, precision) in enumerate(zip(self.seconds, self.flops, self.precision)):
            if not flops or precision not in ceiling:
                continue
            out += [(k, device, flops / t) for device, t in row.items() if t and flops / t > ceiling[precision]]
        return out

    def to_json(self) -> str:
        doc: dict[str, Any] = {"kernelfleet_costs": COSTS_FORMAT, "source": self.source,
                               "seconds": self.seconds}
        for name in ("flops", "bytes", "precision"):
            if getattr(self, name) is not None:
                doc[name] = getattr(self, name)
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str, where: str = "<costs>") -> CostTable:
        with reading(where, "cost table"):
            doc = parse(text, "kernelfleet_costs", COSTS_FORMAT)
            rows = [{str(k): (None if v is None else float(v)) for k, v in row.items()} for row in doc["seconds"]]
            counts = {name: None if doc.get(name) is None else
                      [None if v is None else int(v) for v in doc[name]] for name in ("flops", "bytes")}
            precision = doc.get("precision")
            precision = None if precision is None else [None if v is None else str(v) for v in precision]
            return cls(rows, str(doc.get("source", "unknown")), counts["flops"], counts["bytes"], precision)


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
