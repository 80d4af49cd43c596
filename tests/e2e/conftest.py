import subprocess
import sys

import pytest

from e2e_helpers import free_port, wait_http


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
