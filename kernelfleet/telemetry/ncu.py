"""Nsight Compute's ``ncu --csv`` metrics tables as plain records: a counter source read from files.

ncu writes one row per kernel launch and metric; :func:`parse_ncu_csv` turns that into one
:class:`NcuKernel` per launch, in launch order. What the numbers mean for a study or a profile is
the caller's (``validation/ncu.py``, ``profile/counters.py``).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from kernelfleet.errors import UsageError

# A Hopper SM has four processing blocks (sub-partitions), each with its own tensor core
# (NVIDIA H100 Tensor Core GPU Architecture whitepaper, "H100 SM architecture");
# sm__pipe_tensor_cycles_active.sum counts each, so per SM it is divided by 4 × SMs.
SUB_PARTITIONS_PER_SM = 4


@dataclass(frozen=True, slots=True)
class NcuKernel:
    """One profiled kernel launch: its name and metric values (``None`` where ncu gave none)."""

    name: str
    grid: str
    metrics: dict[str, float | None]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None  # "n/a" and empty cells


def parse_ncu_csv(text: str) -> list[NcuKernel]:
    """Kernels, in launch order, from ``ncu --csv`` output (one row per kernel and metric).

    Lines ncu writes around the table (``==PROF==``, ``==WARNING==``) are skipped; values lose
    their thousands separators.
    """
    rows = csv.DictReader(io.StringIO("".join(line for line in text.splitlines(keepends=True)
                                              if not line.startswith("=="))))
    need = {"ID", "Kernel Name", "Metric Name", "Metric Value"}
    if rows.fieldnames is None or not need <= set(rows.fieldnames):
        raise UsageError(f"not an `ncu --csv` metrics table: expected columns {sorted(need)}, got {rows.fieldnames}")
    kernels: dict[str, NcuKernel] = {}
    for row in rows:
        kernel = kernels.setdefault(row["ID"], NcuKernel(row["Kernel Name"], row.get("Grid Size", ""), {}))
        kernel.metrics[row["Metric Name"]] = _number(row["Metric Value"])
    return list(kernels.values())


def names_match(expected: str, profiled: str) -> bool:
    """Same kernel: equal, or one name contains the other, once a leading ``void `` is dropped, or
    both are the same function with their parameter lists spelled differently.

    The profiler trace keeps the demangled signature; ncu may print only part of it, or write a
    template's parameter type as ``T1::Params`` where the trace spelled it out.
    """
    a, b = expected.removeprefix("void "), profiled.removeprefix("void ")
    return a == b or a in b or b in a or ("(" in a and "(" in b and a.split("(")[0] == b.split("(")[0])
