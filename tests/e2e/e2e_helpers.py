import re
import shutil
import socket
import time
from pathlib import Path

import pytest
import yaml

from kernelfleet.fleet.exporter import OfuCollector

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules.yml"


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


class Tmux:
    """A real terminal: a detached tmux session ``width`` x ``height`` running ``command`` in bash, on a
    tmux server of its own (``-L``), so no other tmux on the machine is touched."""

    def __init__(self, command: str, width: int, height: int, cwd: str) -> None:
        import subprocess
        import uuid

        self._run = subprocess.run
        self.socket = f"kf-test-{uuid.uuid4().hex[:12]}"  # a server per terminal: a killed one never lingers into the next
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), "-c", cwd, command)

    def _tmux(self, *args: str) -> str:
        done = self._run([binary("tmux"), "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def capture(self, escapes: bool = False) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t", *(["-e"] if escapes else []))

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def alternate_screen(self) -> bool:
        return self._tmux("display-message", "-p", "-t", "t", "#{alternate_on}").strip() == "1"

    def wait_for(self, ready, timeout: float = 60.0) -> str:
        """The pane's text once ``ready(text)`` holds; fails with the last text after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.capture()
            if ready(text):
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"the terminal never showed what was waited for; it shows:\n{text}")
            time.sleep(0.2)

    def close(self) -> None:
        self._run([binary("tmux"), "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def load_yaml(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


# Metric names: what the exporter defines, what the rules record, what PromQL uses (the deploy and
# Grafana tests check that every query selects only series that exist).

def exporter_metric_names() -> set[str]:
    """Series names the agent exposes, from the collector itself (no GPU needed)."""
    names = set()
    for family in OfuCollector(list, process_series_per_gpu=1).collect():
        suffix = {"gauge": "", "info": "_info", "counter": "_total"}  # what each type's series is named
        assert family.type in suffix, f"update this test for {family.type} {family.name}"
        names.add(family.name + suffix[family.type])
    assert {"kernelfleet_ofu_ratio", "kernelfleet_gpu_info", "kernelfleet_job_info"} <= names
    return names


def rule_groups() -> list[dict]:
    (doc,) = load_yaml(RULES)
    return doc["groups"]


def recorded_names() -> set[str]:
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


_PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                    "group_left", "group_right", "inf", "nan", "atan2", "start", "end"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (Grafana template variables allowed)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    s = re.sub(r"\$\{[^}]*\}|\$\w+", "", s)  # $var, ${var}
    s = re.sub(r"\{[^{}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\[\]]*\]", "", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    s = re.sub(r"(?<![\w:])[0-9][0-9a-zA-Z_.+-]*", " ", s)  # numbers, durations
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("("):
            continue  # a function
        if m.group() not in _PROMQL_KEYWORDS:
            names.add(m.group())
    return names
