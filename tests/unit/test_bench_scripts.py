"""bench/ as CI sees it: every script imports as a module of the ``bench`` package without doing
any work (STYLE rule 11), every one with a command line answers ``python -m bench.NAME --help``
from the repository root, none reaches a sibling through ``sys.path``, and ruff finds no error
(F codes) in the folder. A broken bench script fails here, not on the next GPU run."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
BENCH = ROOT / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")
WITH_CLI = [name for name in SCRIPTS if "Parser(" in (BENCH / f"{name}.py").read_text()]  # bench.Parser
LIBRARIES = {"loops", "place_calibration", "serve_plans"}  # imported by the recorders, place_table, serve_gpu; no command line of their own
# No options, so no --help: running one does its work (each runs on a CPU in seconds to a minute).
WITHOUT_CLI = {"agent_perf", "make_demo_trace", "plot_disagg", "plot_telemetry"}


def test_every_script_without_a_command_line_is_known():
    # A new script without --help is a decision to make here, not a silent gap in what is checked.
    assert set(SCRIPTS) - set(WITH_CLI) == LIBRARIES | WITHOUT_CLI


@pytest.mark.parametrize("name", SCRIPTS)
def test_imports_as_a_module_without_doing_work(name, monkeypatch, capfd):
    monkeypatch.syspath_prepend(str(ROOT))
    threads = threading.active_count()
    module = importlib.import_module(f"bench.{name}")
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), f"bench.{name} printed at import"
    assert threading.active_count() == threads, f"bench.{name} started a thread at import"
    assert name in LIBRARIES or callable(getattr(module, "main", None)), f"bench.{name} has no main()"


@pytest.mark.parametrize("name", SCRIPTS)
def test_reaches_siblings_as_a_package(name):
    assert "sys.path" not in (BENCH / f"{name}.py").read_text(), f"bench/{name}.py edits sys.path"


def every_script(*flags: str) -> dict[str, subprocess.CompletedProcess]:
    """``python -m bench.NAME FLAGS`` of every script with a command line, all at once."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    running = {name: subprocess.Popen([sys.executable, "-m", f"bench.{name}", *flags], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name in WITH_CLI}
    done = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=180)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    return every_script("--help")


def test_every_command_line_refuses_a_flag_it_does_not_take_in_one_line():
    """argparse's own report is the usage block and the error (bench.Parser makes it one line)."""
    for name, done in every_script("--no-such-flag", "1").items():
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and done.stdout == "", (name, done.stdout[:300])
        assert len(lines) == 1 and "Traceback" not in done.stderr, (name, done.stderr[-500:])
        assert lines[0].startswith(f"python -m bench.{name}: error: ") and "--help says what it takes" in lines[0]


@pytest.mark.parametrize("name", WITH_CLI)
def test_answers_help(name, helps):
    done = helps[name]
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]


def test_ruff_finds_no_error():
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip(f"no ruff beside {sys.executable}")
    done = subprocess.run([str(ruff), "check", "--select", "F", "--output-format", "concise", "bench"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
