"""Cost tables against measured single-device graph times: what timing kernels alone leaves out.

A cost table holds each launch replayed alone (``profile/timing.py``); a plan's predicted time adds
them up. ``kernelfleet bench disagg`` measured the same step on two H200s as one CUDA graph of
``slots`` copies on each profile alone (strategies ``single:<profile>``): seconds per slot. Their
difference is what the replay leaves out — a warm L2 (back-to-back copies of a kernel find their
own data in L2), the gaps between a graph's kernels, the other GPU of the pair.

    python3 -m kernelfleet.profile.graphtime [--tables tests/data/h200-capture] [--measured tests/data/h200x2-disagg]
                                             [--cold DIR]   # cold tables elsewhere (default: --tables)

Tables per step: ``<step>.profile.json`` ("warm": back-to-back copies) and, once recorded,
``<step>.cold-l2.profile.json`` (``bench/capture_run.py --flush-l2-mb 256``, "cold-l2": one copy
after a 256-MB write). A cold table's ``warm_single_seconds`` (one copy, no write: the same launch
cost per trial) is its control, "one copy, warm"; "cold-l2 - launch" = warm + (cold - one copy)
adds the L2's share alone to the warm table.

On the H200 (tests/data/h200-capture, 2026-11-30) the L2 explained none of the gap: cold minus
one copy is -2.2 … +0.1 ms on the pair's profiles (under 2 % of a table; docs/place.md, "Cold L2").
Kernels that skipped their work did: timed after their memsets, every warm table is within 10 % of
its measured graph (docs/place.md, "The gap found"). The cold tables, timed before that fix, still
hold the skipped work.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelfleet.errors import UsageError

DATA = Path(__file__).parents[2] / "tests" / "data"
TABLES = {"warm": ".profile.json", "cold-l2": ".cold-l2.profile.json"}
SINGLE = "one copy, warm"
ADJUSTED = "cold-l2 - launch"


@dataclass(frozen=True, slots=True)
class GraphCheck:
    """One step on one profile: a cost table's sum against the measured graph time per slot."""

    step: str
    profile: str
    table: str  # "warm", "cold-l2", "one copy, warm" or "cold-l2 - launch"
    table_seconds: float  # sum over the launches
    measured_seconds: float | None  # per slot; None: no single-device run of this profile

    @property
    def error_ratio(self) -> float | None:
        """(table - measured) / measured: negative when the table under-predicts."""
        return None if not self.measured_seconds else (self.table_seconds - self.measured_seconds) / self.measured_seconds

    @property
    def measured_over_table(self) -> float | None:
        return None if not self.measured_seconds or not self.table_seconds else self.measured_seconds / self.table_seconds


def per_slot(disagg: dict[str, Any], profile: str) -> float | None:
    """Seconds per slot of the ``single:<profile>`` strategy of a disagg.json, or None."""
    s = disagg.get("strategies", {}).get(f"single:{profile}")
    if not isinstance(s, dict) or not s.get("seconds") or not s.get("slots"):
        return None
    return s["seconds"] / s["slots"]


def graph_checks(step: str, tables: dict[str, dict[str, Any]], disagg: dict[str, Any] | None) -> list[GraphCheck]:
    """Every (table, profile) of one step: ``tables`` maps "warm" / "cold-l2" to capture_run profile
    documents; ``disagg`` is the step's disagg.json (None: nothing measured)."""
    out = []
    warm = tables.get("warm", {}).get("profiles", {})
    for name, doc in tables.items():
        for profile, p in doc.get("profiles", {}).items():
            seconds = p.get("seconds")
            if not isinstance(seconds, list):
                continue  # its timing failed on the GPU
            measured = per_slot(disagg, profile) if disagg else None
            out.append(GraphCheck(step, profile, name, _total(seconds), measured))
            single, base = p.get("warm_single_seconds"), warm.get(profile, {}).get("seconds")
            if name == "cold-l2" and isinstance(single, list) and isinstance(base, list):
                if not len(single) == len(base) == len(seconds):
                    raise UsageError(f"{step} {profile}: warm ({len(base)}), cold ({len(seconds)}) and warm single "
                                     f"({len(single)}) tables have different launch counts")
                out.append(GraphCheck(step, profile, SINGLE, _total(single), measured))
                out.append(GraphCheck(step, profile, ADJUSTED, _total(seconds) + _total(base) - _total(single), measured))
    return out


def load_checks(tables: Path, measured: Path, cold: Path | None = None) -> list[GraphCheck]:
    """Every step with a warm table under ``tables`` and a disagg.json under ``measured``; cold tables
    are looked for under ``cold`` (default: ``tables``)."""
    out = []
    for path in sorted(measured.glob("*.disagg.json")):
        step = path.name.removesuffix(".disagg.json")
        where = {"warm": tables, "cold-l2": cold or tables}
        docs = {name: _read(where[name] / f"{step}{suffix}") for name, suffix in TABLES.items()
                if (where[name] / f"{step}{suffix}").is_file()}
        if "warm" in docs:
            out += graph_checks(step, docs, _read(path))
    if not out:
        raise UsageError(f"no step has both {tables}/STEP.profile.json and {measured}/STEP.disagg.json")
    return out


def _total(seconds: list[float | None]) -> float:
    return sum(v for v in seconds if v is not None)


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read ({exc})") from exc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=DATA / "h200-capture")
    parser.add_argument("--measured", type=Path, default=DATA / "h200x2-disagg")
    parser.add_argument("--cold", type=Path, help="where the <step>.cold-l2.profile.json are (default: --tables)")
    args = parser.parse_args(argv)
    try:
        rows = load_checks(args.tables, args.measured, args.cold)
    except UsageError as exc:
        sys.exit(f"graphtime: {exc}")
    print(f"command: python3 -m kernelfleet.profile.graphtime --tables {args.tables} --measured {args.measured}"
          + (f" --cold {args.cold}" if args.cold else ""))
    print(f"{'step':18} {'profile':10} {'table':17} {'table ms':>9} {'measured ms/slot':>17} {'error':>7} "
          f"{'measured/table':>15}")
    for r in rows:
        measured = "—" if r.measured_seconds is None else f"{r.measured_seconds * 1e3:.1f}"
        error = "—" if r.error_ratio is None else f"{r.error_ratio:+.0%}"
        ratio = "—" if r.measured_over_table is None else f"{r.measured_over_table:.2f}x"
        print(f"{r.step:18} {r.profile:10} {r.table:17} {r.table_seconds * 1e3:9.1f} {measured:>17} {error:>7} "
              f"{ratio:>15}")


if __name__ == "__main__":
    main()
