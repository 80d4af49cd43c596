"""A real headless Chromium loads the agent's dashboard and the test reads the rendered page."""

import re
import subprocess
import sys
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


def test_dashboard_greys_out_and_says_why_when_the_agent_cannot_be_reached(tmp_path):
    """The page from a server with no API behind it: every fetch fails, as when the agent died."""
    import http.server
    import shutil
    import threading

    import kernelfleet.fleet.server as server

    site = tmp_path / "site"
    shutil.copytree(server.DASHBOARD, site / "static")
    shutil.copy(server.DASHBOARD / "index.html", site / "index.html")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        dom, _ = render(f"http://127.0.0.1:{httpd.server_address[1]}/", tmp_path)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert re.search(r'<body class="offline"', dom), "the page stayed live with no agent behind it"
    # The four fetches run together and the first to fail is named: which one is a race.
    assert re.search(r'id="status" class="alert">agent unreachable \(api/(fleet|gpus|jobs/summary|events): HTTP 404\)',
                     dom)


def test_dashboard_greys_out_when_its_data_is_old(tmp_path):
    """An agent whose source has gone quiet (a recording replayed at 1/20 speed: a window each
    20 s): the API still answers, but with the window from before, so the page is not live."""
    from pathlib import Path

    from e2e_helpers import free_port, wait_http

    port = free_port()
    trace = Path(__file__).parents[1] / "data" / "h200" / "h200-idle.jsonl.gz"
    proc = subprocess.Popen([sys.executable, "-m", "kernelfleet", "agent", "--replay", str(trace), "--speed", "0.05",
                             "--store", str(tmp_path / "kf.db"), "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        time.sleep(12.0)  # past the page's 10 s, before the next window
        dom, _ = render(f"http://127.0.0.1:{port}/", tmp_path)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert re.search(r'<body class="offline"', dom)
    assert re.search(r'id="status" class="alert">data is \d+ s old: the agent samples no more', dom)
