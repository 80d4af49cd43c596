import shutil
import socket
import time

import pytest




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
