"""The command line as a user meets it: real processes, exit codes, one-line errors."""

import ctypes.util
import gzip
import http.server
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
HAS_NVML = ctypes.util.find_library("nvidia-ml") is not None


def kf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, text=True, timeout=60)


def one_line_error(done: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0]


def test_watch_once_json_over_a_replay(h200_trace):
    done = kf("watch", "--once", "--json", "--replay", str(h200_trace / "h200-bf16-gemm.jsonl.gz"))
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["sku"] == "h200-sxm" and row["bottleneck"] == "idle" and row["ofu_ratio"] == 0.0


def test_watch_demo_once_table():
    done = kf("watch", "--demo", "--once")
    assert done.returncode == 0, done.stderr
    assert "OFU" in done.stdout and "H200" in done.stdout


def test_corrupt_replay_names_file_and_line(tmp_path, h200_trace):
    text = gzip.decompress((h200_trace / "h200-idle.jsonl.gz").read_bytes()).decode().splitlines()
    text[2] = text[2][:50]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(text) + "\n")
    one_line_error(kf("watch", "--json", "--replay", str(bad), "--speed", "1000"), 2, "bad.jsonl:3:", "corrupt")


def test_missing_replay_file(tmp_path):
    one_line_error(kf("watch", "--once", "--replay", str(tmp_path / "none.jsonl")), 2, "no such trace file")


@pytest.mark.skipif(HAS_NVML, reason="this machine has NVML; the no-GPU path is what CI checks")
@pytest.mark.parametrize("command", [["watch", "--once"], ["record", "-o", "x.jsonl", "--duration", "1"]])
def test_no_nvml_is_one_line_pointing_at_replay(command, tmp_path):
    done = subprocess.run([sys.executable, "-m", "kernelfleet", *command], capture_output=True, text=True, cwd=tmp_path)
    one_line_error(done, 3, "NVML", "--replay")
    assert not (tmp_path / "x.jsonl").exists()


def test_interval_below_gpm_minimum():
    one_line_error(kf("watch", "--once", "--interval", "0.01"), 2, "at least 0.1")


def test_replay_and_demo_together():
    one_line_error(kf("watch", "--demo", "--replay", "x"), 2, "not both")


def test_catalog_json_and_unknown_key():
    done = kf("catalog", "--json", "h200-sxm")
    assert done.returncode == 0
    (sku,) = json.loads(done.stdout)
    assert sku["tensor_clock_ratio"] == {"hmma": 0.903, "dfma": 0.995} and sku["dense_peak_flops"]["bf16"] == 989.4e12
    assert sku["peak_clock_hertz"]["fp64_tensor"] == 1.98e9 and "probe" in sku["tensor_clock_evidence"]
    one_line_error(kf("catalog", "no-such-gpu"), 2, "no-such-gpu")


@pytest.mark.parametrize(
    "listen, needle", [("0.0.0.0:9400", "--allow-remote"), ("localhost", "HOST:PORT"), ("127.0.0.1:99999", "HOST:PORT")]
)
def test_agent_listen_address_is_checked(listen, needle, tmp_path):
    one_line_error(kf("agent", "--demo", "--store", str(tmp_path / "kf.db"), "--listen", listen), 2, needle)
    assert not (tmp_path / "kf.db").exists()  # refused before anything was written


def test_agent_refuses_a_file_that_is_not_a_store(tmp_path):
    (tmp_path / "kf.db").write_text("not sqlite" * 200)
    one_line_error(kf("agent", "--demo", "--store", str(tmp_path / "kf.db")), 2, "not a kernelfleet store")


def test_a_scraped_gpu_that_leaves_expires_after_the_agents_expire(tmp_path):
    """--expire reaches the scrape source: it used to keep a GPU that left dcgm-exporter as stale for
    its own 600 s, so the agent, given a fresh stale window of it every scrape, never let it go (the
    fault campaign, bench/fault_campaign.py, found it)."""
    line = 'DCGM_FI_DEV_SM_CLOCK{{gpu="{0}",UUID="GPU-{0}",modelName="NVIDIA H200"}} 1500\n'
    answers = [line.format(0) + line.format(1)]  # both GPUs at the first scrape, then GPU 1 is gone

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (answers.pop(0) if answers else line.format(0)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = subprocess.Popen([sys.executable, "-m", "kernelfleet", "agent", "--scrape",
                              f"http://127.0.0.1:{exporter.server_address[1]}/metrics", "--interval", "0.2",
                              "--expire", "1", "--store", str(tmp_path / "kf.db"), "--listen", f"127.0.0.1:{port}"],
                             stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for _ in range(300):  # until GPU 1 is gone, for a minute at most (the old agent kept it 10)
            try:
                seen.append(sorted(g["uuid"] for g in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/gpus"))["gpus"]))
            except OSError:
                pass  # not listening yet
            if seen and seen[-1] == ["GPU-0"]:
                break
            time.sleep(0.2)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        exporter.shutdown()
    assert ["GPU-0", "GPU-1"] in seen and seen[-1] == ["GPU-0"], seen


def test_bench_ofu_report_prints_every_section_from_the_recorded_runs():
    """The report end to end, as printed; its rows are checked with exact values where each section's
    analysis is tested (test_h200_recordings.py, test_ncu_sweep.py, test_ofu_clock.py, test_clock_check.py)."""
    data = Path(__file__).parents[1] / "data"
    sweep = str(data / "h200-sweep")
    done = kf("bench", "ofu-report", sweep, "--ncu", sweep, "--clock", str(data / "h200-clock"))
    assert done.returncode == 0, done.stderr
    assert "| bf16 | 15 | 1.19 | 80% | 100% | 0.66 | 93% | 100% |" in done.stdout
    assert "fp64 1990 MHz (measured: 1980 MHz / 0.995)" in done.stdout
    assert "target bf16: corrected MAE 0.66 ≤ 0.5 pp: missed by 0.16 pp" in done.stdout
    assert "target fp16: corrected MAE 0.37 ≤ 0.5 pp: met (0.13 pp to spare)" in done.stdout
    assert "fitted f_ref: bf16 2005 MHz, fp16 2019 MHz, tf32 2026 MHz, fp8 2015 MHz, fp64 1983 MHz" in done.stdout
    assert "Nsight Compute: 60 of 60 sweep kernels profiled (2 runs" in done.stdout
    assert "| bf16 | 15 | 15/15 (13/15 without clusters) | 4096 counted |" in done.stdout
    assert "| bf16 | 8192×8192×8192 | gmma | 4 (4) | 0.641 | 0.864 | 1525 | 1379 | 1376 | 0.905 | 0.902 | 0.998 |" in done.stdout
    assert "\nverdict: cycles (decided by the probe): SM cycles elapse slower than NVML reports" in done.stdout


def test_bench_ofu_report_on_a_missing_sweep(tmp_path):
    one_line_error(kf("bench", "ofu-report", str(tmp_path)), 2, "no such file")


@pytest.mark.skipif(HAS_NVML, reason="this machine may have a GPU; CI checks the no-GPU path")
def test_bench_ofu_without_a_gpu(tmp_path):
    one_line_error(kf("bench", "ofu", "--out", str(tmp_path)), 3, "needs an NVIDIA GPU")


def test_ptx_census_of_an_nvcc_file_and_a_malformed_one(tmp_path):
    ptx_file = Path(__file__).parents[1] / "data" / "ptx" / "chase_nvcc_sm80.ptx"
    (entry,) = json.loads(kf("ptx", str(ptx_file), "--json").stdout)
    assert entry["pinned"] and entry["params"]["_Z5chasePKPfS__param_1"] == "write"
    bad = tmp_path / "bad.ptx"
    bad.write_text(".version 8.0\n.target sm_90\n.visible .entry k(\n  .param .u64 p\n{\n}\n")
    one_line_error(kf("ptx", str(bad)), 2, "bad.ptx: PTX line 5")


def test_a_gpu_out_of_memory_is_one_line_saying_what_to_do(monkeypatch, capsys):
    """torch's OutOfMemoryError out of any command (bench disagg on an 8B step with four replicas
    on one H200 raised it from deep in the gate) ends as one line, not a traceback."""
    import torch

    import kernelfleet.cli as cli

    def out_of_memory(**_) -> None:  # as typer's app is called: prog_name, standalone_mode
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 MiB.\nIncluding non-PyTorch memory")

    monkeypatch.setattr(cli, "app", out_of_memory)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelfleet: error: the GPU ran out of memory (CUDA out of")
    assert "fewer --slots" in lines[0]


def every_command(group, path=()):
    """The path of every command under ``group`` (typer's click tree), groups included."""
    yield path
    for name, command in getattr(group, "commands", {}).items():
        yield from every_command(command, path + (name,))


def test_every_command_prints_its_help():
    """A help text is rendered as rich markup: a bracket that reads as a tag ("[/KERNELS]") once
    turned `--help` into a traceback."""
    import typer
    from typer.testing import CliRunner

    from kernelfleet.cli import app

    paths = list(every_command(typer.main.get_command(app)))
    assert len(paths) > 15
    for path in paths:
        done = CliRunner().invoke(app, [*path, "--help"])
        assert done.exit_code == 0 and done.exception is None, (path, done.output[-300:])
        assert "Usage" in done.output and "Traceback" not in done.output, path


def test_an_unknown_pod_owners_mode_is_one_line(tmp_path):
    done = kf("agent", "--demo", "--pod-owners", "labels", "--store", str(tmp_path / "kf.db"))
    one_line_error(done, 2, "--pod-owners", "names or api")


def test_the_dashboard_reads_its_catalog_first_and_a_missing_one_is_one_line(tmp_path):
    done = kf("dashboard", "--prometheus", "http://127.0.0.1:1", "--catalog", str(tmp_path / "none.toml"))
    one_line_error(done, 2, "none.toml")


# A flag or argument typer itself refuses (unknown, missing, malformed) in every part of the command
# line: one line on stderr naming the command, nothing on stdout, exit code 2 (typer's own report
# is a box of five lines or more).
USAGE_CORPUS = [
    (("watch", "--bogus"), "kernelfleet watch: No such option: --bogus"),
    (("watch", "--interval", "fast"), "kernelfleet watch: Invalid value for '--interval'"),
    (("record", "--clock-poll", "1e"), "kernelfleet record: Invalid value for '--clock-poll'"),
    (("agent", "--interval"), "kernelfleet agent: Option '--interval' requires an argument"),
    (("dashboard", "extra"), "kernelfleet dashboard: Missing option '--prometheus'"),
    (("dashboard", "--prometheus", "http://x", "extra"),
     "kernelfleet dashboard: Got unexpected extra argument(s) (extra)"),
    (("job", "a", "b"), "kernelfleet job: Got unexpected extra argument(s) (b)"),
    (("ptx",), "kernelfleet ptx: Missing argument 'path'"),
    (("profile", "llama-decode", "--trials", "three"), "kernelfleet profile: Invalid value for '--trials'"),
    (("profile", "llama-decode", "--graph-copies", "2.5"), "kernelfleet profile: Invalid value for '--graph-copies'"),
    (("profile-merge",), "kernelfleet profile-merge: Missing argument 'folders"),
    (("plan", "program.json"), "kernelfleet plan: Missing argument 'costs'"),
    (("plan", "p.json", "c.json", "--copy-us", "NaNx"), "kernelfleet plan: Invalid value for '--copy-us'"),
    (("census",), "kernelfleet census: Missing argument 'costs'"),
    (("run", "llama-decode", "--slots", "[2]"), "kernelfleet run: Invalid value for '--slots'"),
    (("plan-serve",), "kernelfleet plan-serve: Missing argument 'target'"),
    (("serve", "hf:x", "--slots", "abc"), "kernelfleet serve: Invalid value for '--slots'"),
    (("serve", "hf:x", "--listen"), "kernelfleet serve: Option '--listen' requires an argument"),
    (("bench", "disagg", "s", "--slots"), "kernelfleet bench disagg: Option '--slots' requires an argument"),
    (("bench", "disagg"), "kernelfleet bench disagg: Missing argument 'step'"),
    (("bench", "nope"), "kernelfleet bench: No such command 'nope'"),
    (("nonsense",), "kernelfleet: No such command 'nonsense'"),
    (("serve", "--\udcff"), "kernelfleet serve: No such option"),
]


@pytest.mark.parametrize("args, said", USAGE_CORPUS, ids=[" ".join(a)[:40] for a, _ in USAGE_CORPUS])
def test_a_flag_typer_refuses_is_one_line_naming_the_command(args, said):
    done = subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, timeout=60)
    stderr = done.stderr.decode(errors="replace")
    one_line_error(subprocess.CompletedProcess(done.args, done.returncode, "", stderr), 2, said)
    assert "--help says what it takes" in stderr and "╭" not in stderr and done.stdout == b""


@pytest.mark.parametrize("args", [(), ("bench",)], ids=["kernelfleet", "bench"])
def test_no_arguments_still_show_the_help_and_help_is_still_help(args):
    bare, helped = kf(*args), kf(*args, "--help")
    assert bare.returncode == 2 and bare.stderr == "" and "Usage: kernelfleet" in bare.stdout
    assert helped.returncode == 0 and helped.stderr == "" and "Usage: kernelfleet" in helped.stdout
