"""The dashboard's own logic, run by Node on the page's real app.js with the browser's objects stubbed:
a gap in a series becomes a null, so the chart breaks its line there instead of drawing a flat one."""

import json
import shutil
import subprocess

import pytest

from kernelfleet.fleet.server import DASHBOARD

pytestmark = pytest.mark.unit

HARNESS = """
const vm = require("vm");
const fs = require("fs");
const element = () => ({ replaceChildren() {}, append() {}, classList: { toggle() {}, add() {} }, style: {} });
const context = {
  location: { hash: "" }, URLSearchParams, Date, Math, console,
  document: { getElementById: element, querySelector: element, createElement: element, body: element() },
  fetch: () => new Promise(() => {}), setInterval: () => 0,
};
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), context);
console.log(JSON.stringify(vm.runInContext(process.argv[2], context)));
"""


def js(expression: str):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: `make test` installs it (Debian package nodejs)")
    done = subprocess.run([node, "-e", HARNESS, str(DASHBOARD / "app.js"), expression],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_gap_in_a_series_becomes_a_null_between_its_ends():
    ts = [0, 1, 2, 3, 10, 11, 12]
    found = js(f"withGaps([{ts}, [0.5, 0.5, 0.5, 0.5, 0.6, 0.6, 0.6]])")
    assert found == [[0, 1, 2, 3, 6.5, 10, 11, 12], [0.5, 0.5, 0.5, 0.5, None, 0.6, 0.6, 0.6]]


def test_a_series_without_gaps_is_left_as_it_is():
    assert js("withGaps([[0, 60, 120, 180], [0.1, 0.2, 0.3, 0.4]])") == [[0, 60, 120, 180], [0.1, 0.2, 0.3, 0.4]]
