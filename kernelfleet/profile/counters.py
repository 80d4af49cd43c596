"""Hardware counters of each distinct kernel on each device profile, and the class they put it in.

``bench/profile_counters.sh`` runs Nsight Compute (clocks not locked) on one launch of every group
of launches (``profile/groups.py``) per profile, inside the nested NVTX ranges ``counters`` /
PROFILE / GROUP; :func:`parse_counters` reads its ``--csv`` output (through ``telemetry.ncu``'s reader)
and joins each row to its group by those ranges.

**Classes.** As ncu's own Speed Of Light rule reads its two headline numbers, SM throughput
(``sm__throughput``) and memory throughput (``gpu__compute_memory_throughput``: the busiest of
DRAM, L2 and L1), both in % of peak over the kernel's elapsed time:

* ``latency``: both below 60 %. ncu's rule: "achieved compute throughput and/or memory bandwidth
  below 60.0% of peak typically indicate latency issues" — too few warps, waves or bytes in
  flight to load either side;
* ``memory``: memory throughput ≥ SM throughput (the memory side saturates first);
* ``tensor``: SM throughput above memory, and the tensor pipe busy in at least half of the SMs'
  active cycles (``sm__pipe_tensor_cycles_active`` / (4 sub-partitions × ``sm__cycles_active``),
  as ``validation/ncu.py`` counts it). In the committed OFU sweep (tests/data/h200-sweep) every GEMM of
  17 µs or more keeps the pipe ≥ 65 % busy and every one under 9 µs ≤ 45 %: 0.5 sits in the gap;
* ``compute``: SM throughput above memory, tensor pipe less busy (or not counted): FMA/ALU work.

On the H200 run (tests/data/h200-counters, whole GPU) the classes read as they should: prefill's
nvjet GEMMs are tensor (pipe 0.85–0.98 busy); decode's weight GEMVs of 120 MB (gate, up, down) and
its flash attention are memory (78–91 % of DRAM peak), as is the 556-MB lm_head GEMV of both steps;
decode's compute class is not a GEMV but the strided bf16 copies (``direct_copy_kernel_cuda``,
537 MB each, 64 a step) at 81 % SM and 25 % DRAM, whose time grows with fewer SMs (×2.3 on 56,
×4.1 on 32). ``latency`` means "saturates neither side", not "indifferent to the device": decode's
34-MB q/o GEMVs (57 % of DRAM peak, 12.5 µs) and prefill's elementwise kernels at 54–55 % SM are
latency by the 60 % rule, yet their time follows bandwidth or SMs on the partitions.

**On a partition** ncu profiles kernels inside green-context partitions (the 2026-11-30 run,
tests/data/h200-counters: every group on every profile). What its percentages are of, measured on
that run (tests/replay/test_counters_h200.py):

* ``sm__throughput`` is of the partition's own SMs, not of the GPU's 132. For the kernels above
  5 % on the whole GPU, percent × SMs × duration is the same on 132, 56 and 32 SMs (median ratio
  0.99, lowest 0.65; it would be 0.42 and 0.24 if ncu averaged over idle SMs): the SM-bound
  strided bf16 copies of 8B decode read 81.3 / 82.1 / 82.3 % while taking 1 / 2.3 / 4.1 times as
  long. It is used as it is. (Dividing it by the SM share, as first written, classed the 32-SM partition's
  GEMVs, flash attention and memory-bound elementwise kernels compute.)
* DRAM (and L2) throughput is of the whole GPU's peak: they are device-wide. The same 1,077 MB
  flash attention reads 90.6 / 73.9 / 46.1 % of DRAM (4.36 / 3.56 / 2.22 TB/s). Memory throughput
  is divided by the profile's copy bandwidth over the whole GPU's (both calibrated in the counters
  run), capped at 100 %: the partition's reach, not the GPU's.
* ``sm__cycles_active.avg`` is over the partition's SMs too, so the tensor ratio divides the pipe's
  cycles by the partition's SMs (prefill's largest GEMM reads 0.98 on all three; over all 132 SMs
  it read 0.42 and 0.24, and the partitions' GEMMs were classed compute).

**What the counters are not.** ncu serializes the GPU's work and flushes caches before each
replay pass (its default ``--cache-control all``): the counters are of a kernel alone with a cold
L2, on a partition without the compute profile's copy hog (a hog's DRAM traffic would be counted
as the kernel's, device-wide counters). The class says what limits the kernel, not how the hog
slows it.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kernelfleet.documents import read_text
from kernelfleet.errors import UsageError
from kernelfleet.profile.groups import Groups
from kernelfleet.telemetry.ncu import SUB_PARTITIONS_PER_SM, names_match, parse_ncu_csv

DURATION = "gpu__time_duration.sum"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_READ, DRAM_WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
L2_BYTES = "lts__t_bytes.sum"
TENSOR_ACTIVE = "sm__pipe_tensor_cycles_active.sum"
SM_ACTIVE = "sm__cycles_active.avg"
WARPS_PCT = "sm__warps_active.avg.pct_of_peak_sustained_active"
GRID_SIZE = "launch__grid_size"
# What bench/profile_counters.sh asks ncu for (each only if `ncu --query-metrics` lists it).
METRICS = (DURATION, SM_PCT, MEMORY_PCT, DRAM_PCT, DRAM_READ, DRAM_WRITE, L2_BYTES, TENSOR_ACTIVE, SM_ACTIVE,
           "sm__cycles_elapsed.avg", WARPS_PCT, GRID_SIZE)

LATENCY_PCT = 60.0  # ncu's Speed Of Light rule: below this on both sides, latency-bound
TENSOR_ACTIVE_RATIO = 0.5  # tensor pipe busy in half the active SM cycles: a tensor-core kernel
CLASSES = ("tensor", "compute", "memory", "latency")

# ncu's CSV carries base units (the 2026-11 sweep: "ns", "byte", "%"); scaled ones are converted.
_BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
_SECONDS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1.0,
            "second": 1.0}


@dataclass(frozen=True, slots=True)
class KernelCounters:
    """ncu's counts of one group's representative launch on one profile (None: not collected)."""

    profile: str
    group: str
    kernel: str
    duration_seconds: float | None
    sm_pct: float | None  # of the profile's own SMs' peak, as ncu gives it (module docstring)
    memory_pct: float | None  # of the whole GPU's peak, as ncu gives it
    dram_pct: float | None
    dram_bytes: float | None  # read + write
    l2_bytes: float | None
    tensor_active_ratio: float | None
    warps_active_pct: float | None
    memory_share: float = 1.0  # the profile's copy bandwidth over the whole GPU's

    @property
    def memory_pct_of_profile(self) -> float | None:
        return None if self.memory_pct is None else min(100.0, self.memory_pct / self.memory_share)

    @property
    def kind(self) -> str | None:
        """The class (module docstring); None without both throughputs."""
        return classify(self.sm_pct, self.memory_pct_of_profile, self.tensor_active_ratio)


def classify(sm_pct: float | None, memory_pct: float | None, tensor_active_ratio: float | None) -> str | None:
    """tensor / compute / memory / latency from throughputs in % of the profile's own peak."""
    if sm_pct is None or memory_pct is None:
        return None
    if max(sm_pct, memory_pct) < LATENCY_PCT:
        return "latency"
    if memory_pct >= sm_pct:
        return "memory"
    return "tensor" if tensor_active_ratio is not None and tensor_active_ratio >= TENSOR_ACTIVE_RATIO else "compute"


def parse_counters(text: str, groups: Groups, where: str = "<counters>") -> list[KernelCounters]:
    """Every profiled kernel of an ``ncu --csv`` run of ``bench/profile_counters.sh``, joined to ``groups``.

    A row outside the ``counters`` NVTX ranges, of a group or profile the groups file does not
    have, with another grid or block than its group, or profiled twice, is a UsageError: the
    CSV and the groups file are not of one run."""
    table = _table(text, where)
    try:
        kernels = parse_ncu_csv(table)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from exc
    extras = _columns(table)
    known, shares = groups.by_id(), _memory_shares(groups)
    out: dict[tuple[str, str], KernelCounters] = {}
    for kernel, (row_id, nvtx, block, units) in zip(kernels, extras):
        profile, group = _ranges(nvtx, groups, f"{where}: row ID {row_id}")
        g = known[group]
        if (g.grid is not None and _dims(kernel.grid) != g.grid) or (g.block is not None and _dims(block) != g.block):
            raise UsageError(f"{where}: row ID {row_id} ({group} on {profile}) ran grid {kernel.grid} block {block}, "
                             f"its group {g.grid} {g.block}: the CSV and the groups file are of different runs")
        if not same_kernel(g.name, kernel.name):
            raise UsageError(f"{where}: row ID {row_id} ran {kernel.name[:60]!r}, group {group} is {g.name[:60]!r}: "
                             "the CSV and the groups file are of different runs")
        if (profile, group) in out:
            raise UsageError(f"{where}: {group} on {profile} profiled twice (two runs in one file?)")
        m = {name: _base(value, units.get(name), name, where) for name, value in kernel.metrics.items()}
        out[profile, group] = KernelCounters(
            profile, group, kernel.name, m.get(DURATION), m.get(SM_PCT), m.get(MEMORY_PCT), m.get(DRAM_PCT),
            _sum(m.get(DRAM_READ), m.get(DRAM_WRITE)), m.get(L2_BYTES), _tensor_ratio(m, groups, profile),
            m.get(WARPS_PCT), shares.get(profile, 1.0))
    return list(out.values())


def load_counters(path: str | Path, groups: Groups) -> list[KernelCounters]:
    """:func:`parse_counters` of an ncu CSV file (gzip-compressed when its name ends in ``.gz``)."""
    return parse_counters(read_text(path, "an ncu CSV"), groups, str(path))


def seen(rows: list[KernelCounters], groups: Groups) -> dict[str, tuple[int, int]]:
    """Per profile of the run: (groups ncu returned counters for, groups launched in the ranges)."""
    got = Counter(r.profile for r in rows)
    names = list(groups.profiles) or list(groups.launched) or sorted(got)
    return {p: (got.get(p, 0), len(groups.launched.get(p, ()))) for p in names}


def launch_classes(rows: list[KernelCounters], groups: Groups, profile: str) -> list[str]:
    """The class of every launch by its group's counters on ``profile``: a class of :data:`CLASSES`,
    the node kind for memsets and copies (ncu profiles kernels only), or "no counters"."""
    kind = {r.group: r.kind for r in rows if r.profile == profile}
    out = ["no counters"] * groups.launches
    for g in groups.groups:
        label = g.kind if g.kind != "kernel" else (kind.get(g.id) or "no counters")
        for i in g.launches:
            out[i] = label
    return out


def same_kernel(captured: str, profiled: str) -> bool:
    """The capture's (mangled) kernel name against ncu's: ``telemetry.ncu.names_match`` when both are in one
    form. ncu demangles by default, and its demangler names anonymous namespaces ``<unnamed>`` and
    may drop the namespaces around them (``void at::<unnamed>::CatArrayBatchedCopy_vectorized<…>(…)``
    for ``_ZN2at6native40_GLOBAL__N__…30CatArrayBatchedCopy_vectorizedI…``): only the function's own
    name is compared, as the mangled name spells it (length, then name)."""
    if captured.startswith("_Z") and not profiled.startswith("_Z"):
        name = function_name(profiled)
        return bool(name) and f"{len(name)}{name}" in captured
    return names_match(captured, profiled)


def function_name(demangled: str) -> str:
    """The innermost name of a demangled signature: what is left of its last word once every
    ``<…>`` and ``(…)`` group (template arguments, parameters, ``(anonymous namespace)``) is gone."""
    depth, kept = 0, []
    for ch in demangled:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    return words[-1].split("::")[-1] if words else ""


def _table(text: str, where: str) -> str:
    """The CSV from its header on: whatever the profiled program printed to stdout before it goes."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise UsageError(f"{where}: not an `ncu --csv` metrics table (no \"ID\" header line); "
                         "was ncu run with --csv, and did it profile anything?")
    return "".join(lines[start:])


def _columns(table: str) -> list[tuple[str, str, str, dict[str, str]]]:
    """Per profiled kernel, in the order ``parse_ncu_csv`` returns them: its ID, NVTX column, block
    size and metric units (which that reader leaves out)."""
    rows = csv.DictReader(io.StringIO("".join(line for line in table.splitlines(keepends=True)
                                              if not line.startswith("=="))))
    nvtx = next((c for c in rows.fieldnames or () if "Push/Pop_Range" in c), None)
    if nvtx is None:
        raise UsageError(f"no NVTX column in the CSV (got {rows.fieldnames}): run ncu with --nvtx")
    out: dict[str, tuple[str, str, str, dict[str, str]]] = {}
    for row in rows:
        entry = out.setdefault(row["ID"], (row["ID"], row[nvtx], row.get("Block Size", ""), {}))
        entry[3][row["Metric Name"]] = row.get("Metric Unit", "")
    return list(out.values())


def _ranges(cell: str, groups: Groups, where: str) -> tuple[str, str]:
    """(profile, group) from ncu's NVTX column, whose push/pop stack reads like
    ``676  "<default domain>:counters:none:…" "<default domain>:whole:none:…" …``."""
    tokens = [t for t in re.split(r'[\s":/]+', cell) if t]
    if "counters" not in tokens:
        raise UsageError(f"{where}: launched outside the NVTX range 'counters' (NVTX column {cell[:80]!r}); "
                         "run ncu with --nvtx --nvtx-include counters/")
    after = tokens[tokens.index("counters") + 1:]
    profiles = set(groups.profiles) | set(groups.launched)
    profile = next((t for t in after if t in profiles), None) if profiles else next(
        (t for t in after if t != "none" and not t.startswith("<") and not t.endswith(">")), None)
    group = next((t for t in after if re.fullmatch(r"g\d+", t)), None)
    if profile is None or group is None or group not in groups.by_id():
        raise UsageError(f"{where}: NVTX ranges {cell[:120]!r} name no profile of {sorted(profiles)} and group "
                         f"of the groups file: the CSV and the groups file are of different runs")
    return profile, group


def _dims(text: str) -> tuple[int, ...] | None:
    numbers = re.findall(r"\d+", text)
    return tuple(int(n) for n in numbers) if numbers else None


def _base(value: float | None, unit: str | None, name: str, where: str) -> float | None:
    """``value`` in bytes or seconds where its unit is one of those (ncu may scale them), else as is."""
    if value is None:
        return None
    unit = unit or ""
    if name == DURATION or unit in _SECONDS:
        if unit not in _SECONDS:
            raise UsageError(f"{where}: {name} in unit {unit!r}, expected one of {sorted(_SECONDS)}")
        return value * _SECONDS[unit]
    if "byte" in unit:
        if unit not in _BYTES:
            raise UsageError(f"{where}: {name} in unit {unit!r}, expected one of {sorted(_BYTES)}")
        return value * _BYTES[unit]
    return value


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _tensor_ratio(m: dict[str, float | None], groups: Groups, profile: str) -> float | None:
    """Tensor-pipe cycles per active SM cycle: the pipe's sum over the profile's SMs, over 4 sub-partitions
    × those SMs × ``sm__cycles_active.avg`` (an average over the profile's SMs: module docstring)."""
    active, pipe = m.get(SM_ACTIVE), m.get(TENSOR_ACTIVE)
    p = groups.profiles.get(profile, {})
    sms = p.get("sms") or p.get("device_sms")
    if active is None or pipe is None or not sms or not active:
        return None
    return pipe / (SUB_PARTITIONS_PER_SM * active * sms)


def _memory_shares(groups: Groups) -> dict[str, float]:
    """Each profile's copy bandwidth over the whole GPU's (1 for the whole GPU, or if either is missing)."""
    whole = next((p for p in groups.profiles.values() if p.get("sms") is None), {})
    full = whole.get("copy_bytes_per_second")
    out = {}
    for name, p in groups.profiles.items():
        mine = p.get("copy_bytes_per_second")
        out[name] = mine / full if mine and full and p.get("sms") is not None else 1.0
    return out
