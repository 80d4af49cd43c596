"""One frame of the live view for a terminal of a given size: GPU rows, the selected GPU's detail,
per-process rows and the keys.

Columns have fixed widths per terminal width, chosen by rank: the rank-0 columns fit 80 columns
(OFU, tensor and DRAM bars, memory, temperature, power, an OFU sparkline), wider terminals add the
model, SM clock, TFLOP/s, SM activity, bottleneck and process count, then widen bars and history.
Every line is at most the terminal's width, so nothing wraps and no number is cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from kernelfleet.catalog import Catalog
from kernelfleet.catalog.notes import same_die_note
from kernelfleet.watch.cells import MISSING, bar, clip, memory, number, ofu_style, pct, spark
from kernelfleet.watch.state import SORTS, ViewState, row_key

Row = dict[str, Any]
KEYS_HELP = "q quit · s sort · ↑↓ or 0-9 select · ▼ OFU regression"


@dataclass(frozen=True)
class Column:
    header: str
    width: int  # cells on the narrowest terminal that shows it
    rank: int  # 0: always shown; higher ranks join as the terminal widens
    cell: Callable[[Row, int, ViewState], Text | str]
    grow: int = 0  # extra cells it takes from a wider terminal
    left: bool = False  # left-aligned (text) rather than right-aligned (numbers)


def _meter(key: str, style: Callable[[float | None], str]) -> Callable[[Row, int, ViewState], Text]:
    def cell(row: Row, width: int, state: ViewState) -> Text:
        value = row[key]
        return Text.assemble(bar(value, width - 7, style(value)), " ", (pct(value).rjust(6), style(value)))
    return cell


def _gpu(row: Row, width: int, state: ViewState) -> str:
    return clip(str(row["gpu"]) if row["mig_instance"] is None else f"{row['gpu']}:{row['mig_instance']}", width)


def _mark(row: Row, width: int, state: ViewState) -> Text:
    if row["stale"]:
        return Text("!", "bold red")
    return Text("▼", "bold red") if row_key(row) in state.regressions else Text(" ")


def _tflops(row: Row, width: int, state: ViewState) -> str:
    bf16 = row["achieved_flops_if_precision"].get("bf16")
    return number(None if bf16 is None else bf16 / 1e12, ".0f", "", width)


COLUMNS: tuple[Column, ...] = (
    Column("", 1, 0, _mark),
    Column("GPU", 4, 0, _gpu, left=True),
    Column("model", 6, 1, lambda r, w, s: clip(r["name"].removeprefix("NVIDIA "), w), grow=10, left=True),
    Column("OFU", 11, 0, _meter("ofu_ratio", ofu_style), grow=10, left=True),
    Column("tensor", 11, 0, _meter("tensor_active_ratio", lambda v: "cyan"), grow=6, left=True),
    Column("DRAM bw", 11, 0, _meter("dram_bandwidth_ratio", lambda v: "magenta"), grow=6, left=True),
    Column("memory", 10, 0, lambda r, w, s: memory(r["memory_used_bytes"], r["memory_total_bytes"], w)),
    Column("temp", 4, 0, lambda r, w, s: number(r["temperature_celsius"], ".0f", "C", w)),
    Column("power", 5, 0, lambda r, w, s: number(r["power_mean_watts"], ".0f", "W", w)),
    Column("SM clk", 7, 3, lambda r, w, s: number(None if r["sm_clock_mean_hertz"] is None
                                                 else r["sm_clock_mean_hertz"] / 1e6, ".0f", "MHz", w)),
    Column("TFLOP/s", 7, 4, _tflops),
    Column("SM act", 6, 5, lambda r, w, s: pct(r["sm_active_ratio"]).rjust(w)),
    Column("bottleneck", 12, 6, lambda r, w, s: clip(r["bottleneck"], w), grow=14, left=True),
    Column("procs", 5, 7, lambda r, w, s: str(len(r["processes"])).rjust(w)),
    Column("history", 7, 0, lambda r, w, s: spark(s.history.get(row_key(r), ()), w), grow=60, left=True),
)


def fit(width: int) -> list[tuple[Column, int]]:
    """The columns a terminal ``width`` wide shows, in display order, with their widths."""
    chosen: set[int] = set()
    used = -1  # n columns take n - 1 separating spaces
    for rank in sorted({c.rank for c in COLUMNS}):
        for i, column in enumerate(COLUMNS):
            if column.rank == rank and used + 1 + column.width <= width:
                chosen.add(i)
                used += 1 + column.width
    widths = {i: COLUMNS[i].width for i in chosen}
    for i in sorted(chosen, key=lambda i: COLUMNS[i].rank):  # spare cells to the most important first
        extra = min(COLUMNS[i].grow, width - used)
        widths[i] += extra
        used += extra
    return [(COLUMNS[i], widths[i]) for i in sorted(chosen)]


def _line(parts: list[Text | str]) -> Text:
    return Text(" ").join(Text(p) if isinstance(p, str) else p for p in parts)


def gpu_lines(rows: list[Row], state: ViewState, width: int) -> list[Text]:
    layout = fit(width)
    header = _line([c.header.ljust(w) if c.left else c.header.rjust(w) for c, w in layout])
    header.stylize("bold")
    selected = state.current(rows)
    out = [header]
    for row in state.ordered(rows):
        if row["stale"]:
            parts: list[Text | str] = [c.cell(row, w, state) for c, w in layout[:2]]
            out.append(_line([*parts, Text(f"stale: {row['error'] or 'no reading'}", "red")])[:width])
            continue
        line = _line([c.cell(row, w, state) for c, w in layout])
        if row is selected:
            line.stylize("on grey23")
        out.append(line)
    return out


def pack(parts: list[str], width: int) -> list[str]:
    """``parts`` joined by " · " into lines of at most ``width``; a part never splits mid-word."""
    lines: list[str] = []
    current = ""
    # (text, the separator before it): parts apart by " · ", the words of a part too long for a line by " "
    atoms = [(w, " · " if i == 0 else " ") for p in parts
             for i, w in enumerate([p] if len(p) <= width else p.split(" "))]
    for atom, sep in atoms:
        joined = atom if not current else f"{current}{sep}{atom}"
        if len(joined) <= width:
            current = joined
        else:
            lines.append(current)
            current = atom
    return [*lines, current] if current else lines


def detail_parts(row: Row, note: str | None) -> list[str]:
    """The selected GPU, with every figure OFU was made from."""
    clock, ref = row["sm_clock_mean_hertz"], row["reference_clock_hertz"]
    bf16 = row["achieved_flops_if_precision"].get("bf16")
    reasons = row["clock_event_reasons"]
    parts = [
        f"GPU {row['gpu']}" + ("" if row["mig_instance"] is None else f" MIG {row['mig_instance']}"),
        row["name"], row["uuid"],
        (f"OFU {pct(row['ofu_ratio'])} = tensor {pct(row['tensor_active_ratio'])} × SM "
         f"{MISSING if clock is None else f'{clock / 1e6:.0f} MHz'} / f_ref "
         f"{MISSING if ref is None else f'{ref / 1e6:.0f} MHz'} ({row['reference_clock_source']})"),
        f"bf16 ≈ {MISSING if bf16 is None else f'{bf16 / 1e12:.0f} TFLOP/s'}",
        f"SM active {pct(row['sm_active_ratio'])}", f"DRAM bw {pct(row['dram_bandwidth_ratio'])}",
        f"bottleneck {row['bottleneck']}",
        f"PCIe ↑{_rate(row['pcie_tx_bytes_per_second'])} ↓{_rate(row['pcie_rx_bytes_per_second'])}",
        f"NVLink ↑{_rate(row['nvlink_tx_bytes_per_second'])} ↓{_rate(row['nvlink_rx_bytes_per_second'])}",
        "throttle " + (MISSING if reasons is None else ", ".join(reasons) or "none"),
        f"Xid {MISSING if row['xid_errors_total'] is None else row['xid_errors_total']}"
        + ("" if row["xid_last"] is None else f" (last {row['xid_last']})"),
        f"ECC {_count(row['ecc_corrected_errors_total'])} corrected, {_count(row['ecc_uncorrected_errors_total'])} uncorrected",
    ]
    if row["ofu_unavailable_reason"]:
        parts.append(f"OFU n/a: {row['ofu_unavailable_reason']}")
    return parts + ([note] if note else [])


def _rate(value: float | None) -> str:
    return MISSING if value is None else f"{value / 1e6:.1f} MB/s"


def _count(value: int | None) -> str:
    return MISSING if value is None else str(value)


def process_lines(rows: list[Row], state: ViewState, width: int, height: int) -> list[Text]:
    """Per-process rows (GPU, PID, user, job, memory, name), largest memory first, in ``height`` lines."""
    if height < 2:
        return []
    procs = [(row, p) for row in state.ordered(rows) for p in row["processes"]]
    procs.sort(key=lambda rp: -(rp[1]["used_memory_bytes"] or 0))
    name_w = 12
    job_w = max(8, width - (4 + 7 + 10 + 7 + name_w + 5))
    header = Text(f"{'GPU':<4} {'PID':>7} {'user':<10} {'job':<{job_w}} {'memory':>7} {'process':<{name_w}}"[:width],
                  "bold")
    shown = procs if len(procs) <= height - 1 else procs[: height - 2]
    out = [header]
    for row, p in shown:
        gpu = _gpu(row, 4, state)
        out.append(Text(f"{gpu} {p['pid']:>7} {clip(p['user'] or MISSING, 10)} {clip(p['job'] or MISSING, job_w)} "
                        f"{memory(p['used_memory_bytes'], None, 7)} {clip(p['name'] or MISSING, name_w)}"[:width]))
    if len(shown) < len(procs):
        out.append(Text(f"… {len(procs) - len(shown)} more processes", "dim"))
    return out if procs else [header, Text("no compute processes", "dim")]


def frame(rows: list[Row], state: ViewState, title: str, width: int, height: int, note: Callable[[Row], str | None]
          ) -> Group:
    """Everything on screen, at most ``height`` lines of at most ``width`` cells."""
    sort = f"sort: {state.sort}{' ↓' if SORTS[state.sort][1] else ''}"
    top = Text(clip(title, max(0, width - len(sort) - 1)) + " " + sort, "bold")
    lines = [top, *gpu_lines(rows, state, width)]
    selected = state.current(rows)
    if selected is not None and not selected["stale"]:
        lines += [Text(""), *(Text(t, "cyan" if i == 0 else "") for i, t in
                              enumerate(pack(detail_parts(selected, note(selected)), width)))]
        history = state.history.get(row_key(selected), ())
        lines.append(Text(f"OFU {spark(history, max(1, width - 4))}", "green"))
    room = height - len(lines) - 2  # a blank line and the keys line
    lines += [Text(""), *process_lines(rows, state, width, room)] if room >= 3 else []
    return Group(*lines[: max(1, height - 1)], Text(clip(KEYS_HELP, width), "dim"))



def snapshot(rows: list[Row], title: str, width: int, catalog: Catalog) -> Group:
    """One window without a terminal to drive (``watch --once``): GPU rows, every process, and the
    reference-clock note when an H100 or H200 is among the GPUs."""
    state = ViewState()
    state.observe(rows)
    notes = {same_die_note(catalog, catalog.get(r["sku"])) for r in rows if r["sku"]} - {None}
    lines = [Text(title, "bold"), *gpu_lines(rows, state, width), Text(""),
             *process_lines(rows, state, width, 2 + sum(len(r["processes"]) for r in rows))]
    return Group(*lines, *(Text(line, "dim") for n in sorted(notes) for line in pack([n], width)))
