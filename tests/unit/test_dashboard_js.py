"""The dashboard's own logic, run by Node on the page's real scripts with the browser's
objects stubbed: a gap in a series becomes a null, so the chart breaks its line there instead of
drawing a flat one; the URL's state; a one-point axis; host sorting; GPU names in events; the heatmap's scale."""

import json
import re
import shutil
import subprocess

import pytest

from kernelfleet.fleet.server import DASHBOARD

pytestmark = pytest.mark.unit
PAGE = (DASHBOARD / "index.html").read_text()

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
for (const file of process.argv[1].split(",")) vm.runInContext(fs.readFileSync(file, "utf8"), context);
console.log(JSON.stringify(vm.runInContext(process.argv[2], context)));
"""


def js(expression: str):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: `make test` installs it (Debian package nodejs)")
    # the page's own scripts, in the order index.html loads them (uPlot left out: nothing here draws)
    scripts = ",".join(str(DASHBOARD / name) for name in re.findall(r'src="static/(\w+\.js)"', PAGE))
    done = subprocess.run([node, "-e", HARNESS, scripts, expression],
                          check=False, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_gap_in_a_series_becomes_a_null_between_its_ends():
    ts = [0, 1, 2, 3, 10, 11, 12]
    found = js(f"withGaps([{ts}, [0.5, 0.5, 0.5, 0.5, 0.6, 0.6, 0.6]])")
    assert found == [[0, 1, 2, 3, 6.5, 10, 11, 12], [0.5, 0.5, 0.5, 0.5, None, 0.6, 0.6, 0.6]]


def test_a_series_without_gaps_is_left_as_it_is():
    assert js("withGaps([[0, 60, 120, 180], [0.1, 0.2, 0.3, 0.4]])") == [[0, 60, 120, 180], [0.1, 0.2, 0.3, 0.4]]


def test_the_url_holds_the_view_the_selection_and_the_range():
    s = {"view": "gpu", "host": "node-007", "gpu": "GPU-ab/c", "job": None, "range": "6h", "sort": "-ofu",
         "open": ["node-001", "node-007"], "below": 30, "price": None}
    hash_ = js(f"writeHash({json.dumps(s)})")
    assert hash_ == "#view=gpu&host=node-007&gpu=GPU-ab%2Fc&range=6h&sort=-ofu&open=node-001%2Cnode-007"
    assert js(f"readHash({json.dumps(hash_)})") == {**s, "token": None}
    job = js("writeHash({view: 'job', host: null, gpu: null, job: 'train 1', range: '1h', sort: 'host', open: null, "
             "below: 50, price: 2.5})")
    assert job == "#view=job&job=train+1&range=1h&below=50&price=2.5"


def test_a_bad_url_falls_back_to_the_fleet_view():
    got = js("readHash('#view=nope&range=3y&sort=sideways&below=250&price=-1')")
    assert (got["view"], got["range"], got["sort"], got["below"], got["price"]) == ("fleet", "1h", "host", 30, None)


def test_a_one_point_series_gets_a_minute_either_side_not_years():
    assert js("xRange(1.8e9, 1.8e9)") == [1.8e9 - 60, 1.8e9 + 60]
    assert js("xRange(1.8e9, 1.8e9, 1.8e9 - 3600, 1.8e9)") == [1.8e9 - 3600, 1.8e9]  # the chosen range wins


def test_hosts_sort_by_mean_ofu_with_the_unmeasured_last_either_way():
    hosts = [{"host": "c", "mean_ofu_ratio": 0.5}, {"host": "a", "mean_ofu_ratio": None},
             {"host": "b", "mean_ofu_ratio": 0.2}]
    order = lambda sort: [h["host"] for h in js(f"sortHosts({json.dumps(hosts)}, {sort!r})")]
    assert (order("host"), order("ofu"), order("-ofu")) == (["a", "b", "c"], ["b", "c", "a"], ["c", "b", "a"])


def test_an_event_names_its_gpu_by_host_and_index():
    event = {"uuid": "GPU-7fe0", "detail": "OFU of GPU GPU-7fe0 dropped to 0.1"}
    names = {"GPU-7fe0": {"label": "node-3 / GPU 5", "host": "node-3"}}
    assert js(f"eventText({json.dumps(event)}, {json.dumps(names)})") == "OFU of node-3 / GPU 5 dropped to 0.1"
    assert js(f"eventText({json.dumps(event)}, {{}})") == event["detail"]  # an unknown GPU keeps its uuid


def test_the_heatmap_scale_and_rows():
    assert js("[heatColour(0), heatColour(1000), heatColour(null), heatColour(2000)]") == \
        ["rgb(68,1,84)", "rgb(253,231,37)", "#e3e6ec", "rgb(253,231,37)"]
    assert js("[heatRowHeight(8), heatRowHeight(800), heatRowHeight(5000)]") == [16, 1, 1]
    def cell(x, y):  # ten rows of 16 px, four columns of 100 px right of the 96 px gutter
        return js(f"heatCell({{rows: new Array(10), columns: 4, cssWidth: 96 + 400}}, {x}, {y})")

    assert cell(96 + 150, 16 * 3 + 2) == {"row": 3, "column": 1}
    assert cell(10, 5) is None  # the host names' gutter
    assert cell(96 + 150, 16 * 10 + 1) is None  # under the last row


def test_the_terms_quote_the_thresholds_the_classifier_and_detector_use():
    from kernelfleet.fleet.detect import RegressionDetector
    from kernelfleet.ofu import bottleneck as b

    terms = js("Object.fromEntries(Object.entries(TERMS).map(([k, v]) => [k, v[1]]))")
    assert f"{100 * b.TENSOR_BOUND_ACTIVE:.0f} %" in terms["tensor-bound"]
    assert f"{100 * b.MEMORY_BOUND_BANDWIDTH:.0f} %" in terms["memory-bound"]
    assert f"{100 * b.LATENCY_SM_ACTIVE:.0f} %" in terms["low-occupancy/launch-bound"]
    assert f"{100 * b.CUDA_CORE_BOUND_ACTIVE:.0f} %" in terms["cuda-core-bound"]
    assert f"{100 * b.IDLE_SM_ACTIVE:.0f} %" in terms["idle"]
    d = RegressionDetector()
    assert (f"{100 * d.drop_ratio:.0f} %" in terms["regression"] and f"{d.confirm_windows} windows" in terms["regression"]
            and f"{100 * d.recover_ratio:.0f} %" in terms["regression"])
    classes = {c.value for c in b.Bottleneck}
    assert classes <= set(terms)  # every class the page can show is explained
