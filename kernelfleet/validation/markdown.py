"""``bench ofu-report``'s rows (``validation/report.py``) as markdown, the text docs/validation/ofu.md quotes.

Each function returns one section's text; nothing here computes a figure, it only formats one.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelfleet.validation.mfu import ErrorSummary
from kernelfleet.validation.report import ClockSection, NcuSection, TableII

TABLE_II_HEADER = ("| precision | points | raw MAE (pp) | raw ≤2 pp | raw ≤5 pp | corrected MAE (pp) | corrected ≤2 pp | "
                   "corrected ≤5 pp |\n|---|---|---|---|---|---|---|---|")
NCU_PRECISION_HEADER = (
    "| precision | profiled | executed ops = name model | FLOP per active cycle per SM | mean ncu active | "
    "mean GPM active | f_true/f_nvml mean (min–max) | corrected MAE, counted ops (pp) |\n|---|---|---|---|---|---|---|---|")
NCU_KERNEL_HEADER = (
    "| precision | M×N×K | ncu ops = name | ncu active | GPM active | NVML MHz | f_true MHz | f_true/f_nvml | "
    "ncu clock MHz |\n|---|---|---|---|---|---|---|---|---|")
LOOP_HEADER = (
    "| precision | M×N×K | path | windows (probed) | MFU | GPM active | NVML MHz | f_true MHz | probe MHz | "
    "f_true/NVML | probe/NVML | GPM/math | ncu cycles ÷ loop time ÷ NVML | ncu/probe, same clock | power-capped | "
    "HW slowdown |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
LAUNCH_HEADER = ("| precision | M×N×K | path | duration µs | ncu MHz | NVML MHz (reads) | NVML min MHz | ncu/NVML |\n"
                 "|---|---|---|---|---|---|---|---|")


def _mhz(hz: float | None) -> str:
    return "—" if hz is None else f"{hz / 1e6:.0f}"


def _r3(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _share(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def _errors(rows: Sequence[ErrorSummary]) -> list[str]:
    return [TABLE_II_HEADER] + [
        f"| {s.precision} | {s.points} | {s.raw_mae_pp:.2f} | {s.raw_within_2pp:.0%} | {s.raw_within_5pp:.0%} | "
        f"{s.corrected_mae_pp:.2f} | {s.corrected_within_2pp:.0%} | {s.corrected_within_5pp:.0%} |" for s in rows]


def table_ii(t: TableII) -> str:
    """Table II, the f_ref line, the targets, and the in-sample fit."""
    lines = _errors(t.errors)
    lines.append("\nf_ref: " + ", ".join(
        f"{r.precision} {r.hertz / 1e6:.0f} MHz ({r.basis}: {r.peak_clock_hertz / 1e6:.0f} MHz"
        + (f" / {r.peak_clock_hertz / r.hertz:.3f})" if r.basis == "measured" else ")")
        for r in t.reference_clocks))
    for g in t.targets:
        verdict = f"met ({-g.miss_pp:.2f} pp to spare)" if g.miss_pp <= 0 else f"missed by {g.miss_pp:.2f} pp"
        lines.append(f"target {g.precision}: corrected MAE {g.corrected_mae_pp:.2f} ≤ {g.target_mae_pp:g} pp: "
                     f"{verdict}")
    lines.append("\nIn-sample, for comparison only "
                 "(each precision's f_ref fitted so its corrected errors average zero):")
    lines.append("fitted f_ref: " + ", ".join(f"{q} {hz / 1e6:.0f} MHz" for q, hz in t.fitted_clock_hertz.items()))
    return "\n".join(lines + _errors(t.fitted_errors))


def ncu_section(n: NcuSection) -> str:
    """The Nsight Compute check: per precision, then per kernel."""
    lines = [f"\nNsight Compute: {len(n.profiled)} of {n.sweep_points} sweep kernels profiled"
             + (f" ({n.runs} runs; a later run's point replaces an earlier one's)" if n.runs > 1 else ""),
             NCU_PRECISION_HEADER]
    for s in n.summaries:
        same = (f"{s.ops_equal_name}/{s.ops_counted} ({s.ops_equal_tile_only}/{s.ops_counted} without clusters)"
                if s.ops_counted else "not counted")
        rate = "—" if s.flops_per_active_cycle is None else f"{s.flops_per_active_cycle:.0f} {s.rate_basis}"
        ratio = ("—" if s.mean_clock_ratio is None
                 else f"{s.mean_clock_ratio:.3f} ({s.min_clock_ratio:.3f}–{s.max_clock_ratio:.3f})")
        mae = "—" if s.corrected_mae_pp is None else f"{s.corrected_mae_pp:.2f}"
        lines.append(f"| {s.precision} | {s.profiled} | {same} | {rate} | {s.mean_ncu_active_ratio:.3f} | "
                     f"{_r3(s.mean_gpm_active_ratio)} | {ratio} | {mae} |")
    lines.append("\n" + NCU_KERNEL_HEADER)
    for row in n.kernels:
        c, p = row.check, row.profiled
        same = {None: "—", True: "yes", False: "no"}[p.ops_equal_name]
        lines.append(f"| {c.precision} | {c.m}×{c.n}×{c.k} | {same} | {c.ncu_active_ratio:.3f} | "
                     f"{c.gpm_tensor_active_ratio:.3f} | {_mhz(c.nvml_sm_clock_hertz)} | "
                     f"{_mhz(c.implied_sm_clock_hertz)} | {c.clock_ratio:.3f} | {_mhz(p.sm_clock_hertz)} |")
    return "\n".join(lines)


def clock_section(s: ClockSection) -> str:
    """The clock check: loops, launches under ncu, the verdict and the catalog's ratios."""
    lines = [] if s.ncu_left_out is None else [f"\nClock check: the ncu half is left out: {s.ncu_left_out}"]
    lines += [f"\nClock check: {len(s.loops)} loops, {len(s.ncu)} launches under ncu", LOOP_HEADER]
    for row in s.loops:
        c = row.clock
        shape = f"{c.m}×{c.n}×{c.k}" + (f" + {c.filler_launches} adds" if c.filler_launches else "")
        lines.append(
            f"| {c.precision} | {shape} | {c.path} | {c.windows} ({c.probe_windows}) | {c.mfu_ratio:.3f} | "
            f"{c.gpm_tensor_active_ratio:.3f} | {_mhz(c.nvml_sm_clock_hertz)} | {_mhz(c.implied_sm_clock_hertz)} | "
            f"{_mhz(c.probe_sm_clock_hertz)} | {c.true_over_nvml:.3f} | {_r3(c.probe_over_nvml)} | "
            f"{_r3(c.gpm_over_math)} | {_r3(row.ncu_cycles_over_nvml)} | {_r3(row.ncu_over_probe)} | "
            f"{_share(c.power_capped_ratio)} | {_share(c.hw_slowdown_ratio)} |")
    if s.ncu:
        lines.append("\n" + LAUNCH_HEADER)
        lines += [f"| {n.precision} | {n.m}×{n.n}×{n.k} | {n.path} | {n.duration_seconds * 1e6:.1f} | "
                  f"{_mhz(n.ncu_sm_clock_hertz)} | {_mhz(n.nvml_sm_clock_hertz)} ({n.nvml_reads}) | "
                  f"{_mhz(n.nvml_min_hertz)} | {_r3(n.ncu_over_nvml)} |" for n in s.ncu]
    v = s.verdict
    lines.append(f"\nverdict: {v.finding}" + (f" (decided by the {v.decided_by})" if v.decided_by else "")
                 + f": {v.describe()}")
    if s.catalog_ratios:
        lines.append("catalog: " + ", ".join(f"tensor_clock_ratio.{pipe} = {r:g}" for pipe, r in s.catalog_ratios.items())
                     + f" ({s.sku_key}; f_ref = peak clock / ratio)")
    return "\n".join(lines)
