"""Hardware counters of each distinct kernel on each device profile, and the class they put it in.

``bench/profile_counters.sh`` runs Nsight Compute (clocks not locked) on one launch of every group
of launches (``profile/groups.py``) per profile, inside the nested NVTX ranges ``counters`` /
PROFILE / GROUP; :func:`parse_counters` reads its ``--csv`` output (through ``ofu.ncu``'s reader)
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
  as ``ofu/ncu.py`` counts it). In the committed OFU sweep (tests/data/h200-sweep) every GEMM of
  17 µs or more keeps the pipe ≥ 65 % busy and every one under 9 µs ≤ 45 %: 0.5 sits in the gap;
* ``compute``: SM throughput above memory, tensor pipe less busy (or not counted): FMA/ALU work.

**On a partition** the percentages are of the whole GPU's peak, which a partition cannot reach.
Each is divided by the profile's share of it before the thresholds apply: SM throughput by the
share of SMs the work partition holds (assuming ncu averages over all the GPU's SMs, idle ones
included — to check on the first run: a large GEMM's value on 32 SMs should be ~32/132 of the
whole GPU's), memory throughput by the profile's copy bandwidth over the whole GPU's (both
calibrated in the counters run). Both are capped at 100 %. The tensor ratio is per active cycle
and needs no correction.

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

from kernelfleet.errors import UsageError
from kernelfleet.ofu.ncu import names_match, parse_ncu_csv
from kernelfleet.profile.groups import Groups

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
SUB_PARTITIONS_PER_SM = 4  # each counts its own tensor pipe (ofu/ncu.py: H100 whitepaper)
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
    sm_pct: float | None  # of the whole GPU's peak, as ncu gives it
    memory_pct: float | None
    dram_pct: float | None
    dram_bytes: float | None  # read + write
    l2_bytes: float | None
    tensor_active_ratio: float | None
    warps_active_pct: float | None
    sm_share: float = 1.0  # the profile's share of the GPU's SMs
    memory_share: float = 1.0  # its copy bandwidth over the whole GPU's

    @property
    def sm_pct_of_profile(self) -> float | None:
        return None if self.sm_pct is None else min(100.0, self.sm_pct / self.sm_share)

    @property
    def memory_pct_of_profile(self) -> float | None:
        return None if self.memory_pct is None else min(100.0, self.memory_pct / self.memory_share)

    @property
    def kind(self) -> str | None:
        """The class (module docstring); None without both throughputs."""
        return classify(self.sm_pct_of_profile, self.memory_pct_of_profile, self.tensor_active_ratio)


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
    known, shares = groups.by_id(), _shares(groups)
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
        sm_share, memory_share = shares.get(profile, (1.0, 1.0))
        out[profile, group] = KernelCounters(
            profile, group, kernel.name, m.get(DURATION), m.get(SM_PCT), m.get(MEMORY_PCT), m.get(DRAM_PCT),
            _sum(m.get(DRAM_READ), m.get(DRAM_WRITE)), m.get(L2_BYTES), _tensor_ratio(m, groups, profile),
            m.get(WARPS_PCT), sm_share, memory_share)
    return list(out.values())


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
    """The capture's (mangled) kernel name against ncu's: ``ofu.ncu.names_match`` when both are in one
    form; a demangled ncu name (``void at::native::foo<4>(...)``) must have its function's name
    (``foo``) in the mangled one (ncu demangles by default)."""
    if captured.startswith("_Z") and not profiled.startswith("_Z"):
        found = re.match(r"(?:void\s+)?([\w:]+)", profiled.replace("(anonymous namespace)::", ""))
        base = found.group(1).split("::")[-1] if found else ""
        return bool(base) and base in captured
    return names_match(captured, profiled)


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
    """Tensor-pipe cycles per active SM cycle, over the SMs that ran (sm__cycles_active.avg is over all)."""
    active, pipe = m.get(SM_ACTIVE), m.get(TENSOR_ACTIVE)
    sms = groups.profiles.get(profile, {}).get("device_sms")
    if active is None or pipe is None or not sms or not active:
        return None
    return pipe / (SUB_PARTITIONS_PER_SM * active * sms)


def _shares(groups: Groups) -> dict[str, tuple[float, float]]:
    """(SM share, copy-bandwidth share) of each profile against the whole GPU."""
    whole = next((p for p in groups.profiles.values() if p.get("sms") is None), {})
    out = {}
    for name, p in groups.profiles.items():
        sms, total = p.get("sms"), p.get("device_sms")
        sm_share = sms / total if sms and total else 1.0
        mine, full = p.get("copy_bytes_per_second"), whole.get("copy_bytes_per_second")
        out[name] = (sm_share, mine / full if mine and full and p.get("sms") is not None else 1.0)
    return out
