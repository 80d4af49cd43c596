"""Where the agent and the fleet dashboard listen, and the rules that keep that safe.

The socket is bound *before* sampling starts, so a port clash (9400 is also dcgm-exporter's
default) stops the program with one line and a non-zero exit instead of leaving a sampler with no
server behind a banner: ``Restart=on-failure`` and a Kubernetes probe then see the failure. The
HTTP server runs on that socket in a thread; :meth:`Listener.alive` tells the sampling loop when
it died, so the process exits rather than half-runs.

Auth: loopback needs nothing; any other address needs ``--allow-remote`` *and* a token (a remote
listener without one is refused). An empty token is refused everywhere: it would otherwise read as
"no token" and switch auth off without a word.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import EnvironmentProblem, UsageError

TOKEN_VARIABLE = "KERNELFLEET_TOKEN"


def given_token(option: str | None, environ: os._Environ[str] | dict[str, str] = os.environ) -> str | None:
    """The token of ``--token``, else of the environment, an empty one included (the CLI library
    reads an empty variable as unset, which would switch auth off without a word)."""
    return option if option is not None else environ.get(TOKEN_VARIABLE)


def listen_address(listen: str, allow_remote: bool, token: str | None) -> tuple[str, int]:
    """``HOST:PORT`` checked: the address, and the auth it needs (module docstring)."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--listen must be HOST:PORT, got {listen!r}")
    host = host.strip("[]")
    if token is not None and not token.strip():
        raise UsageError("the token is empty (--token or KERNELFLEET_TOKEN): give a real one, or unset it on loopback")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not allow_remote:
        raise UsageError(f"refusing to listen on {host}: not a loopback address; pass --allow-remote (and --token)")
    if not loopback and token is None:
        raise UsageError(f"refusing to listen on {host} without a token: pass --token or set KERNELFLEET_TOKEN "
                         "(every request must then carry it)")
    return host, int(port_text)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or one line saying why there is none."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may follow a crash at once
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise EnvironmentProblem(
                f"cannot listen on {host}:{port}: the port is in use (9400 is also dcgm-exporter's default); "
                "stop what holds it or pass --listen HOST:PORT") from exc
        if exc.errno == errno.EACCES:
            raise EnvironmentProblem(f"cannot listen on {host}:{port}: permission denied (ports below 1024 need "
                                     "privileges); pass --listen with a higher port") from exc
        raise EnvironmentProblem(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


@dataclass
class Listener:
    """An ASGI app served by uvicorn on an already bound socket, in a thread of its own."""

    app: Any
    sock: socket.socket
    _server: Any = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> Listener:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]},
                                        name="kernelfleet-http", daemon=True)
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stops(self, stop: threading.Event) -> None:
        """Set ``stop`` when the server's thread ends, so the sampling loop ends with it."""
        thread = self._thread
        if thread is None:
            raise RuntimeError("start the listener first")
        threading.Thread(target=lambda: (thread.join(), stop.set()), name="kernelfleet-http-watch", daemon=True).start()

    def stop(self, timeout_seconds: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=timeout_seconds)
        self.sock.close()
