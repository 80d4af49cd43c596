"""The store's two guards: one transaction on an autocommit connection, and the writer's lock file."""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from pathlib import Path

from kernelfleet.errors import UsageError


class transaction:
    """BEGIN ... COMMIT on an autocommit connection; ROLLBACK on error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN")

    def __exit__(self, kind: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if kind else "COMMIT")


class WriterLock:
    """An exclusive ``flock`` on ``STORE.lock`` for the life of the writer, holding who took it.

    The kernel drops the lock when the process dies (kill -9 included), so a crash never leaves a
    store locked; the file's text only says who holds it now.
    """

    def __init__(self, store: Path) -> None:
        import fcntl

        self.path = store.with_name(store.name + ".lock")
        try:
            self._file = open(self.path, "a+")  # noqa: SIM115 - held open for the writer's life: it is the lock
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot open the store's lock file ({exc.strerror})") from exc
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise UsageError(f"{store}: another agent writes this store ({holder}); stop it, or give this one "
                             "--store OTHER.db") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}\n")
        self._file.flush()

    def release(self) -> None:
        self._file.close()  # closing the descriptor releases the flock
