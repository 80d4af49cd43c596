"""The live loop of `kernelfleet watch`: a frame per window, keys read while the source waits.

The source's ``sleep`` is where the view waits for the next window (NvmlSource between clock
polls, ReplaySource between recorded windows), so keys are read there, without a thread: the
source never runs concurrently with the view, and quitting unwinds through the source's own
``with`` block. A replay that ends keeps its last frame until q.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live

from kernelfleet.catalog import Catalog
from kernelfleet.catalog.notes import same_die_note
from kernelfleet.watch.keys import Keys
from kernelfleet.watch.rows import Identify, rows
from kernelfleet.watch.screen import frame
from kernelfleet.watch.state import ViewState

KEY_POLL_SECONDS = 0.05  # how soon a key press shows


class _Quit(Exception):
    """q was pressed, somewhere inside the source's wait."""


def run(source: Any, catalog: Catalog, where: str, console: Console, identify: Identify) -> None:
    """Show ``source`` live on ``console`` until q (or Ctrl-C); the terminal is restored on exit."""
    state = ViewState()
    latest: list[dict[str, Any]] = []
    ended = False

    def note(row: dict[str, Any]) -> str | None:
        sku = catalog.get(row["sku"]) if row["sku"] else None
        return same_die_note(catalog, sku) if sku is not None else None

    with Keys() as keys, Live(console=console, auto_refresh=False, screen=True) as live:
        def draw() -> None:
            stamp = max((r["timestamp_seconds"] for r in latest), default=None)
            # the time first: a long file name is what the width cuts, never the time
            title = "kernelfleet watch" + ("" if stamp is None else time.strftime(" %H:%M:%S", time.localtime(stamp))) \
                + f" — {where}" + (", ended" if ended else "")
            live.update(frame(latest, state, title, console.width, console.height, note), refresh=True)

        def wait(seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
            deadline = clock() + seconds
            while True:
                left = deadline - clock()
                pressed = keys.read(max(0.0, min(left, KEY_POLL_SECONDS)))
                for key in pressed:
                    if not state.press(key, latest):
                        raise _Quit
                if pressed:
                    draw()
                if left <= 0:
                    return

        source.sleep = wait
        try:
            draw()
            for batch in source.batches():
                latest = rows(batch, catalog, identify)
                state.observe(latest)
                draw()
                wait(0)
            ended = True
            draw()
            while True:
                wait(3600)
        except _Quit:
            return
