import subprocess
import sys

import pytest

from e2e_helpers import binary, free_port, wait_http


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


@pytest.fixture
def prometheus(agent, tmp_path):
    """A real Prometheus server scraping the agent every second; yields its base URL."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n"
        f"  - job_name: kernelfleet\n    static_configs:\n      - targets: ['127.0.0.1:{agent['port']}']\n"
    )
    proc = subprocess.Popen(
        [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
