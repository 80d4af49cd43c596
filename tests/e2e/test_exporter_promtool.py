"""A real agent with dcgm-exporter's label names and per-process series: promtool parses its /metrics and
finds nothing wrong but the camelCase that dcgm-exporter's names are."""

import subprocess
import sys
import urllib.request

import pytest
from e2e_helpers import binary, free_port, wait_http

pytestmark = pytest.mark.e2e


def test_dcgm_label_names_and_process_series_pass_promtool(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet", "agent", "--demo", "--speed", "4", "--store", str(tmp_path / "kf.db"),
         "--listen", f"127.0.0.1:{port}", "--label-names", "dcgm", "--process-series", "4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert 'kernelfleet_ofu_ratio{GPU_I_ID="",Hostname=' in text and 'modelName="NVIDIA H200"' in text
    assert "kernelfleet_process_memory_used_bytes{" in text and 'process="python3"' in text
    assert "uuid=" not in text and "hostname=" not in text  # every family renamed, none left behind
    done = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          check=False)
    # promtool's style lint flags camelCase label names, as it flags dcgm-exporter's own; nothing else may fail
    complaints = (done.stdout + done.stderr).strip().splitlines()
    assert complaints and all(line.endswith("label names should be written in 'snake_case' not 'camelCase'")
                              for line in complaints), complaints
