"""Fixed-width cells of the live view: numbers, bars and sparklines that never exceed their width.

Every formatter takes the width it must fill and returns exactly that many cells, so the columns
of one terminal width never move between refreshes, and a number is never cut: a value too large
for its format falls back to a coarser one of the same width.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

MISSING = "—"  # no value (unsupported, or an older recording): never shown as 0
GIB = 1024**3
_EIGHTHS = " ▏▎▍▌▋▊▉█"
_SPARKS = "▁▂▃▄▅▆▇█"


def pct(ratio: float | None) -> str:
    """A ratio as "56.3%" (6 cells at most; "100.0%")."""
    return MISSING if ratio is None else f"{100 * min(max(ratio, 0.0), 9.999):.1f}%"


def bar(ratio: float | None, width: int, style: str) -> Text:
    """A horizontal bar of ``width`` cells in eighths, on a dim track; blank when missing."""
    if width <= 0:
        return Text()
    if ratio is None:
        return Text(" " * width)
    eighths = round(min(max(ratio, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    drawn = "█" * full + (_EIGHTHS[part] if part else "")
    return Text.assemble((drawn, style), ("·" * (width - len(drawn)), "grey30"))


def ofu_style(ratio: float | None) -> str:
    """Green where the tensor pipes are well used, yellow in between, red when barely."""
    if ratio is None:
        return "dim"
    return "green" if ratio >= 0.5 else "yellow" if ratio >= 0.2 else "red"


def spark(values: Sequence[float | None], width: int) -> str:
    """The last ``width`` values (ratios 0..1) as a sparkline, right-aligned; a gap is a space."""
    tail = list(values)[-width:]
    cells = [" " if v is None else _SPARKS[min(len(_SPARKS) - 1, int(max(v, 0.0) * len(_SPARKS)))] for v in tail]
    return "".join(cells).rjust(width)


def memory(used: int | None, total: int | None, width: int) -> str:
    """"12.3/141G" (GiB); used alone when the total is unknown; whole GiB when decimals do not fit."""
    if used is None:
        return MISSING.rjust(width)
    for text in _memory_forms(used / GIB, None if total is None else total / GIB):
        if len(text) <= width:
            return text.rjust(width)
    return f"{used / GIB:.0f}G".rjust(width)  # wider than asked only past 10^(width-1) GiB


def _memory_forms(used: float, total: float | None) -> list[str]:
    if total is None:
        return [f"{used:.1f}G", f"{used:.0f}G"]
    return [f"{used:.1f}/{total:.0f}G", f"{used:.0f}/{total:.0f}G", f"{used:.0f}G"]


def number(value: float | None, fmt: str, unit: str, width: int) -> str:
    """``value`` formatted with ``fmt`` and ``unit``, right-aligned in ``width``; missing is "—"."""
    return (MISSING if value is None else f"{value:{fmt}}{unit}").rjust(width)


def clip(text: str, width: int) -> str:
    """Text (a name, never a number) cut to ``width`` with an ellipsis, padded to exactly ``width``."""
    return (text if len(text) <= width else text[: max(0, width - 1)] + "…").ljust(width)
