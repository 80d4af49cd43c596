"""``python -m kernelfleet.fleet.probe [HOST:PORT]``: exit 0 when the agent's ``/healthz`` says so.

The health check of the container image and the Kubernetes exec probes. With a token set,
``/healthz`` needs ``Authorization: Bearer``, and neither Docker's HEALTHCHECK nor an
``httpGet`` probe can take a header's value from a Secret; this probe reads the token from
``KERNELFLEET_TOKEN`` as the agent does, and the address from the argument, else
``KERNELFLEET_LISTEN``, else the agent's default. It imports only the standard library: a
probe starts a Python process every period, so it must start fast. A failure is one line.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_LISTEN = "127.0.0.1:9400"
TIMEOUT_SECONDS = 3.0  # within the DaemonSet probes' timeoutSeconds (5), so the probe, not the kubelet, says why


def check(listen: str, token: str | None, timeout_seconds: float = TIMEOUT_SECONDS) -> str | None:
    """None when ``http://LISTEN/healthz`` answers 200, else why not, in one line."""
    request = urllib.request.Request(f"http://{listen}/healthz")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            response.read()
            return None
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return f"{listen}: 401, the token is missing or wrong (set KERNELFLEET_TOKEN as for the agent)"
        try:
            detail = json.loads(exc.read() or b"{}")
        except ValueError:
            detail = {}
        return f"{listen}: unhealthy, HTTP {exc.code} {json.dumps(detail, sort_keys=True)[:300]}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{listen}: no answer ({reason})"


def main(argv: list[str]) -> int:
    listen = argv[0] if argv else os.environ.get("KERNELFLEET_LISTEN") or DEFAULT_LISTEN
    problem = check(listen, os.environ.get("KERNELFLEET_TOKEN") or None)
    if problem is not None:
        print(f"kernelfleet probe: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
