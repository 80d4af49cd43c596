"""Record samples to a file and replay them: how GPU logic is tested on a CPU.

A trace is JSON Lines, gzip-compressed when the name ends in ``.gz``. Line 1 is
a header ``{"kernelfleet_trace": 1, ...}``; every further line is one batch,
``{"samples": [Sample.to_dict(), ...]}``, as the source yielded it.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import socket
import time
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from kernelfleet.errors import KernelfleetError, UsageError
from kernelfleet.telemetry.sample import Sample

FORMAT_VERSION = 1
# The longest pause a paced replay waits out: a recording's gap (an agent stopped for a night) or a
# corrupt timestamp must not hold the replay for longer.
MAX_GAP_SECONDS = 3600.0


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


class TraceWriter:
    """Appends batches to a trace file, flushing each so a crash loses at most one."""

    def __init__(self, path: str | os.PathLike[str], note: str = "", source: str = "nvml") -> None:
        self.path = Path(path)
        try:
            self._file = _open_text(self.path, "w")
        except OSError as exc:
            raise UsageError(f"cannot write trace {self.path}: {exc.strerror}") from exc
        header = {
            "kernelfleet_trace": FORMAT_VERSION,
            "created_unix": time.time(),
            "host": socket.gethostname(),
            "source": source,
            "note": note,
        }
        self._write(header)
        self.batches = 0

    def write(self, batch: Iterable[Sample]) -> None:
        self._write({"samples": [s.to_dict() for s in batch]})
        self.batches += 1

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass
class ReplaySource:
    """Yields the batches of a trace file.

    ``speed=None`` replays as fast as it can be read; ``speed=1`` at the pace it
    was recorded; ``speed=100`` a hundred times faster. ``loop`` starts again at
    the end. With ``rebase_time`` the timestamps are shifted so the replay
    appears to happen now (what an agent fed by a replay wants).
    """

    path: Path
    speed: float | None = None
    loop: bool = False
    rebase_time: bool = False
    sleep: Callable[[float], None] = time.sleep
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if self.speed is not None and self.speed <= 0:
            raise UsageError(f"replay speed must be positive, got {self.speed}")
        self.header = self._read_header()

    def open(self) -> ReplaySource:
        return self

    def close(self) -> None:
        pass

    def __enter__(self) -> ReplaySource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self, count: int | None = None) -> Iterator[list[Sample]]:
        emitted = 0
        offset = 0.0
        previous: float | None = None
        while True:
            first_time: float | None = None
            last_time = first_window = 0.0
            for batch in self._read_batches():
                stamp = max(s.timestamp_seconds for s in batch)
                if first_time is None:
                    first_time, first_window = stamp, batch[0].window_seconds
                    if self.rebase_time:
                        offset = self.wall() - stamp
                if self.speed is not None and previous is not None:
                    self.sleep(min(MAX_GAP_SECONDS, max(0.0, (stamp + offset - previous) / self.speed)))
                previous = stamp + offset
                last_time = stamp
                if offset:
                    batch = [dataclasses.replace(s, timestamp_seconds=s.timestamp_seconds + offset) for s in batch]
                yield batch
                emitted += 1
                if count is not None and emitted >= count:
                    return
            if not self.loop or first_time is None:
                return
            # Next lap continues the timeline one interval after this lap's end.
            offset += last_time - first_time + first_window
            previous = None

    def _read_header(self) -> dict[str, Any]:
        with self._lines() as lines:
            for number, line in lines:
                record = self._parse(number, line)
                if not isinstance(record, dict) or record.get("kernelfleet_trace") != FORMAT_VERSION:
                    raise UsageError(
                        f"{self.path}:{number}: not a kernelfleet trace "
                        f"(expected a header with kernelfleet_trace={FORMAT_VERSION})"
                    )
                return record
        raise UsageError(f"{self.path}:1: the trace is empty")

    def _read_batches(self) -> Iterator[list[Sample]]:
        with self._lines() as lines:
            next(lines)  # the header, checked in __post_init__
            for number, line in lines:
                record = self._parse(number, line)
                samples = record.get("samples") if isinstance(record, dict) else None
                if not isinstance(samples, list) or not samples:
                    raise UsageError(f"{self.path}:{number}: expected {{\"samples\": [...]}} with at least one sample")
                try:
                    yield [Sample.from_dict(s) for s in samples]
                except KernelfleetError as exc:
                    raise UsageError(f"{self.path}:{number}: {exc}") from exc

    def _parse(self, number: int, line: str) -> Any:
        try:
            return json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{self.path}:{number}: corrupt or truncated line ({exc.msg})") from exc

    def _lines(self) -> _Lines:
        return _Lines(self.path)


class _Lines:
    """Numbered non-empty lines of a (possibly gzipped) file, with clear errors."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Iterator[tuple[int, str]]:
        try:
            self._file = _open_text(self.path, "r")
        except FileNotFoundError as exc:
            raise UsageError(f"{self.path}: no such trace file") from exc
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot read ({exc.strerror})") from exc
        return self._iterate()

    def _iterate(self) -> Iterator[tuple[int, str]]:
        number = 0
        try:
            for number, line in enumerate(self._file, start=1):
                if line.strip():
                    yield number, line
        except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:  # gzip truncated, corrupt, or not gzip
            raise UsageError(f"{self.path}:{number + 1}: corrupt or truncated file ({exc})") from exc

    def __exit__(self, *exc: object) -> None:
        self._file.close()

