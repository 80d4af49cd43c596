"""Fail loud, never half-run: the agent binds before it samples, one writer per store, auth rules.

Real sockets on loopback and real agent processes; each refusal is one line and a non-zero exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet.listener import Listener, bind, listen_address
from kernelfleet.fleet.store import Store

pytestmark = pytest.mark.unit


def kf(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def one_line(done: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: ") and needle in lines[0], done.stderr


@pytest.fixture
def held_port():
    """A loopback port something else already listens on (as dcgm-exporter holds 9400)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("listen, allow, token, needle", [
    ("0.0.0.0:9400", False, "t0ken", "--allow-remote"),
    ("0.0.0.0:9400", True, None, "without a token"),
    ("127.0.0.1:9400", False, "", "the token is empty"),
    ("0.0.0.0:9400", True, "  ", "the token is empty"),
])
def test_listen_rules_refuse_what_would_serve_without_auth(listen, allow, token, needle):
    with pytest.raises(UsageError, match=needle):
        listen_address(listen, allow, token)


def test_listen_rules_allow_loopback_bare_and_remote_with_a_token():
    assert listen_address("127.0.0.1:9400", False, None) == ("127.0.0.1", 9400)
    assert listen_address("[::1]:9400", False, None) == ("::1", 9400)
    assert listen_address("0.0.0.0:9400", True, "t0ken") == ("0.0.0.0", 9400)


def test_a_port_in_use_is_one_line_naming_it(held_port):
    with pytest.raises(EnvironmentProblem, match=f"cannot listen on 127.0.0.1:{held_port}: the port is in use"):
        bind("127.0.0.1", held_port)


def test_the_agent_exits_non_zero_at_once_when_its_port_is_taken(held_port, tmp_path):
    began = time.monotonic()
    done = kf("agent", "--demo", "--store", str(tmp_path / "kf.db"), "--listen", f"127.0.0.1:{held_port}")
    one_line(done, EnvironmentProblem.exit_code, "the port is in use")
    assert time.monotonic() - began < 30
    assert not (tmp_path / "kf.db").exists()  # refused before it sampled or wrote anything


def test_the_agent_refuses_an_empty_token_from_the_environment(tmp_path):
    done = kf("agent", "--demo", "--store", str(tmp_path / "kf.db"), env={"KERNELFLEET_TOKEN": ""})
    one_line(done, UsageError.exit_code, "the token is empty")


def test_one_writer_per_store_and_the_second_says_who_holds_it(tmp_path):
    first = Store(tmp_path / "kf.db", writer=True)
    with pytest.raises(UsageError, match=rf"another agent writes this store \(pid {os.getpid()} on "):
        Store(tmp_path / "kf.db", writer=True)
    reader = Store(tmp_path / "kf.db")  # a report or dashboard reads beside the writer
    assert reader.jobs() == []
    reader.close()
    first.close()
    Store(tmp_path / "kf.db", writer=True).close()  # released with the writer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_second_agent_on_one_store_is_refused_while_the_first_runs(tmp_path):
    store = str(tmp_path / "kf.db")
    first = subprocess.Popen([sys.executable, "-m", "kernelfleet", "agent", "--demo", "--store", store,
                              "--listen", f"127.0.0.1:{free_port()}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "kf.db.lock").exists() or not (tmp_path / "kf.db.lock").read_text():
            assert time.monotonic() < deadline and first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.1)
        second = kf("agent", "--demo", "--store", store, "--listen", f"127.0.0.1:{free_port()}")
        one_line(second, UsageError.exit_code, f"another agent writes this store (pid {first.pid} on ")
    finally:
        first.terminate()
        first.wait(timeout=10)


def test_when_the_server_thread_ends_the_sampling_loop_is_told():
    async def app(scope, receive, send):  # an ASGI app that serves nothing
        return None

    server = Listener(app, bind("127.0.0.1", 0)).start()
    stop = threading.Event()
    server.stops(stop)
    assert server.alive() and not stop.is_set()
    server.stop()
    assert stop.wait(timeout=10) and not server.alive()
