"""`kernelfleet watch` in a real terminal (tmux) at 80 and 200 columns, over H200 recordings.

Set KERNELFLEET_WATCH_CAPTURES=DIR to keep the captures (docs/img/watch-*.txt are made so).
"""

import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from e2e_helpers import Tmux
from recorded import side_by_side

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
OFU_CELL = re.compile(r"\d+\.\d%")
GPU_ROW = re.compile(r"^[ ▼!] (\d)\s")  # the mark column, then the GPU index


@pytest.fixture(scope="module")
def four_gpus(tmp_path_factory):
    """Four recorded H200 runs as GPUs 0-3: idle, bf16 GEMM, copy, fp8 GEMM (their steady windows)."""
    data = ROOT / "tests" / "data" / "h200"
    runs = [data / f"h200-{name}.jsonl.gz" for name in ("idle", "bf16-gemm", "copy", "fp8-gemm")]
    return side_by_side(runs, tmp_path_factory.mktemp("watch") / "four.jsonl.gz", windows=slice(3, 20))


def watch(tmp_path, width, *args):
    """tmux running `kernelfleet watch ARGS`, then printing its exit code and the terminal settings."""
    kf = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "kernelfleet", "watch", *args])
    before, after = tmp_path / "stty-before", tmp_path / "stty-after"
    script = f"stty -g > {before}; {kf}; echo EXIT=$?; stty -g > {after}; sleep 600"
    return Tmux(f"bash -c {shlex.quote(script)}", width, 30, str(ROOT)), before, after


def gpu_rows(text):
    return [line for line in text.splitlines() if GPU_ROW.match(line)]


def keep(text, name):
    where = os.environ.get("KERNELFLEET_WATCH_CAPTURES")
    if where:
        Path(where, name).write_text(text)


@pytest.mark.parametrize("width", [80, 200])
def test_every_number_fits_and_q_restores_the_terminal(four_gpus, tmp_path, width):
    term, before, after = watch(tmp_path, width, "--replay", str(four_gpus), "--speed", "4")
    try:
        text = term.wait_for(lambda t: len(gpu_rows(t)) == 4 and ", ended" in t)
        keep(text, f"watch-{width}.txt")
        keep(term.capture(escapes=True), f"watch-{width}.ansi")
        assert term.alternate_screen()
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines)
        header = next(line for line in lines if " OFU " in line)
        for column in ("OFU", "tensor", "DRAM bw", "memory", "temp", "power", "history"):
            assert column in header
        wide_only = ("SM clk", "TFLOP/s", "SM act", "bottleneck", "procs")
        assert all((c in header) == (width == 200) for c in wide_only), header
        for row in gpu_rows(text):
            # the OFU, tensor and DRAM cells: three whole percentages per row, never "56…"
            assert len(OFU_CELL.findall(row)) == (3 if width == 80 else 4), row
            assert "…" not in row.split("H200")[-1]
        ofu_at = {int(GPU_ROW.match(r)[1]): OFU_CELL.findall(r)[0] for r in gpu_rows(text)}
        assert ofu_at[0] == "0.0%" and ofu_at[2] == "0.0%" and ofu_at[1] != "0.0%" and ofu_at[3] != "0.0%"
        assert "python3" in text and "OFU uses each SKU's reference clock" in text  # processes, H100/H200 note
        term.send("q")
        done = term.wait_for(lambda t: "EXIT=" in t, timeout=20)
        assert "EXIT=0" in done and not term.alternate_screen()
        assert "Traceback" not in done
        term.wait_for(lambda t: after.exists())
        assert before.read_text() == after.read_text()  # cbreak undone: echo and line mode are back
    finally:
        term.close()


def test_s_sorts_by_ofu_and_digits_select_a_gpu(four_gpus, tmp_path):
    term, _, _ = watch(tmp_path, 80, "--replay", str(four_gpus), "--speed", "4")
    try:
        text = term.wait_for(lambda t: ", ended" in t)
        assert [GPU_ROW.match(r)[1] for r in gpu_rows(text)] == ["0", "1", "2", "3"]
        term.send("s")
        text = term.wait_for(lambda t: "sort: ofu" in t)
        order = [GPU_ROW.match(r)[1] for r in gpu_rows(text)]
        ofu = [float(OFU_CELL.findall(r)[0][:-1]) for r in gpu_rows(text)]
        assert order[:2] == ["1", "3"] and ofu == sorted(ofu, reverse=True), text
        term.send("2")
        text = term.wait_for(lambda t: "GPU 2 · NVIDIA H200" in t)
        term.send("Up")
        term.wait_for(lambda t: "GPU 0 · NVIDIA H200" in t)  # in OFU order 1, 3, 0, 2: up from GPU 2 is GPU 0
    finally:
        term.close()


def test_a_regression_is_marked_on_its_gpu(tmp_path):
    term, _, _ = watch(tmp_path, 80, "--demo", "--speed", "20")
    try:
        text = term.wait_for(lambda t: any(r.startswith("▼") for r in gpu_rows(t)), timeout=60)
        keep(text, "watch-80-regression.txt")
    finally:
        term.close()
