"""A real headless Chromium loads the agent's dashboard and the test reads the rendered page."""

import re
import subprocess
import time

import pytest

from e2e_helpers import binary

pytestmark = pytest.mark.e2e


def render(url: str, tmp_path) -> tuple[str, str]:
    """The DOM after the page's scripts ran, and Chromium's log (console messages included)."""
    done = subprocess.run(
        [binary("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium'}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=6000", "--window-size=1400,1000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def test_dashboard_shows_values_and_draws_the_chart(agent, tmp_path):
    time.sleep(4.0)  # a dozen windows of the demo at 4x
    dom, log = render(f"http://127.0.0.1:{agent['port']}/", tmp_path)
    assert re.search(r'id="fleet-gpus">1 / 1<', dom)
    assert re.search(r'id="fleet-ofu">\d+\.\d%<', dom)
    assert "h200-sxm" in dom and "python3-" in dom  # a GPU row and the job holding it
    assert re.search(r'id="status"[^>]*>updated ', dom), "the page never finished a refresh"
    assert re.search(r'<div id="chart">.*<canvas', dom, re.S), "uPlot drew no chart"
    console = [line for line in log.splitlines() if "CONSOLE" in line]
    assert not [line for line in console if re.search(r"error|uncaught", line, re.I)], console
