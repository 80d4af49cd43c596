"""Keys from the terminal without blocking, with the terminal put back however the view exits.

stdin goes into cbreak mode (keys arrive one by one, unechoed) for the life of the context and
its settings are restored on exit, an exception or Ctrl-C included. Not a terminal (a pipe, a
file): no keys, and the view runs until it is stopped.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from typing import IO, Self

# escape sequences of the arrow keys (VT100 and "application cursor" mode)
_ARROWS = {b"\x1b[A": "up", b"\x1b[B": "down", b"\x1bOA": "up", b"\x1bOB": "down"}


class Keys:
    """``with Keys() as keys: keys.read(0.1)`` -> key names pressed within 0.1 s."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdin
        self._saved: list | None = None
        self._fd = -1

    def __enter__(self) -> Self:
        try:
            self._fd = self.stream.fileno()
            if os.isatty(self._fd):
                self._saved = termios.tcgetattr(self._fd)
                tty.setcbreak(self._fd)
        except (OSError, ValueError, termios.error):
            self._saved = None  # no terminal: the view runs without keys
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def read(self, timeout_seconds: float) -> list[str]:
        """Key names that arrive within ``timeout_seconds`` (at once when one is waiting)."""
        if self._saved is None:
            time.sleep(timeout_seconds)  # still the wait the source asked for
            return []
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_seconds))
        if not ready:
            return []
        return parse(os.read(self._fd, 64))


def parse(data: bytes) -> list[str]:
    """Key names in a burst of terminal input: arrows by name, printable keys as themselves."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        arrow = next((name for seq, name in _ARROWS.items() if data.startswith(seq, i)), None)
        if arrow is not None:
            keys.append(arrow)
            i += 3
            continue
        char = chr(data[i])
        if char.isprintable():
            keys.append(char.lower())
        i += 1
    return keys
