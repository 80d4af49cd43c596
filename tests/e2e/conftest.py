import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str:
    """A system binary the e2e tests need; missing is a failure (make test installs it), not a skip."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: `make test` installs it (Debian package prometheus)")
    return path


def wait_http(url: str, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def agent(tmp_path):
    """A real agent process on the bundled H200 recording, serving on a free loopback port."""
    port = free_port()
    store = tmp_path / "kf.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet", "agent", "--demo", "--speed", "4", "--store", str(store),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        yield {"port": port, "store": store, "proc": proc}
    finally:
        proc.kill()
        proc.wait(timeout=10)
