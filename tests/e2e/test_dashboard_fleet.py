"""The dashboard at fleet size in a real headless Chromium, driven over the DevTools protocol: a fleet of
8 GPUs (2 hosts x 4) and one of 800 (100 hosts x 8), each through the real agent, SQLite store and
HTTP server (tests/e2e/e2e_helpers.py: SyntheticFleet). What the page shows is checked against what
the store and report.py say, not against the page's own API answers.

``KERNELFLEET_SCREENSHOTS=docs/img pytest tests/e2e/test_dashboard_fleet.py`` also writes the PNGs of
docs/fleet.md (dashboard at 8 and 800 GPUs, a job's page, a 390 px screen) to that folder.
"""

import json
import os
import urllib.request
from pathlib import Path

import pytest
from e2e_helpers import Browser, SyntheticFleet, fleet_gpu

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.report import job_report, spent_below

pytestmark = pytest.mark.e2e

SHOTS = os.environ.get("KERNELFLEET_SCREENSHOTS")
LIVE = "document.getElementById('status').textContent.startsWith('updated')"
JOB = "train-1000"  # the job of the first two hosts, slowed on the first


def shoot(browser: Browser, name: str) -> None:
    if SHOTS:
        browser.screenshot(Path(SHOTS) / name)


@pytest.fixture(scope="module")
def fleet8(tmp_path_factory):
    fleet = SyntheticFleet(tmp_path_factory.mktemp("fleet8"), hosts=2, per_host=4)
    yield fleet
    fleet.close()


@pytest.fixture(scope="module")
def fleet800(tmp_path_factory):
    fleet = SyntheticFleet(tmp_path_factory.mktemp("fleet800"), hosts=100, per_host=8)
    yield fleet
    fleet.close()


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "chromium")
    yield b
    assert not b.console, b.console  # no script error on any page the test opened
    b.close()


def load(browser: Browser, url: str) -> None:
    browser.goto(url)
    browser.wait_for(LIVE)


def api(fleet: SyntheticFleet, path: str):
    return json.load(urllib.request.urlopen(fleet.url + path, timeout=30))


def host_order(browser: Browser) -> list[str]:
    return browser.js("[...document.querySelectorAll('#hosts tr.host')].map(r => r.dataset.host)")


def test_hosts_open_close_and_sort_by_ofu_at_800_gpus(fleet800, browser):
    load(browser, fleet800.url)
    assert len(host_order(browser)) == 100
    assert browser.js("document.querySelectorAll('#hosts tr.host-gpus').length") == 0, "800 GPUs open at once"
    shoot(browser, "dashboard-800.png")

    browser.js("document.querySelector('#hosts tr.host[data-host=\"node-042\"]').click()")
    browser.wait_for("document.querySelectorAll('#hosts tr.host-gpus tbody tr').length === 8")
    uuids = browser.js("[...document.querySelectorAll('#hosts tr.host-gpus tbody tr')].map(r => r.dataset.uuid)")
    assert uuids == [fleet_gpu(42, i, 8)[0] for i in range(8)]
    assert "open=node-042" in browser.js("location.hash")

    means = {h["host"]: h["mean_ofu_ratio"] for h in api(fleet800, "api/overview")["hosts"]}
    browser.js("document.querySelector('#hosts th[data-sort=\"ofu\"]').click()")
    browser.wait_for("location.hash.includes('sort=ofu')")
    order = "JSON.stringify([...document.querySelectorAll('#hosts tr.host')].map(r => r.dataset.host))"
    rising = sorted(means, key=lambda h: (means[h], h))
    browser.wait_for(f"{order} === {json.dumps(json.dumps(rising, separators=(',', ':')))}")
    browser.js("document.querySelector('#hosts th[data-sort=\"ofu\"]').click()")
    browser.wait_for("location.hash.includes('sort=-ofu')")
    falling = sorted(means, key=lambda h: (-means[h], h))
    browser.wait_for(f"{order} === {json.dumps(json.dumps(falling, separators=(',', ':')))}")
    assert means[host_order(browser)[0]] == max(means.values())
    # the opened host stays open through the sorting
    assert browser.js("document.querySelector('#hosts tr.host-gpus').previousElementSibling.dataset.host") == "node-042"

    browser.js("document.querySelector('#hosts tr.host[data-host=\"node-042\"]').click()")
    browser.wait_for("document.querySelectorAll('#hosts tr.host-gpus').length === 0")


@pytest.mark.parametrize("size", ["fleet8", "fleet800"])
def test_worst_k_lists_the_gpus_of_least_ofu(size, request, browser):
    fleet = request.getfixturevalue(size)
    load(browser, fleet.url)
    browser.wait_for("document.querySelectorAll('#worst tbody tr').length > 0")
    shown = browser.js("[...document.querySelectorAll('#worst tbody tr')].map(r => r.dataset.uuid)")
    # from the agent's own readings: whole GPUs, least OFU first, ties by host and index
    readings = [r for r in fleet.agent.latest() if r.ofu.ofu_ratio is not None]
    worst = sorted(readings, key=lambda r: (r.ofu.ofu_ratio, r.host, r.sample.gpu_index))[:10]
    assert shown == [r.sample.uuid for r in worst]
    assert browser.js("document.querySelector('#worst tbody tr a').textContent") == \
        f"{worst[0].host} / GPU {worst[0].sample.gpu_index}"


@pytest.mark.parametrize("size", ["fleet8", "fleet800"])
def test_the_heatmap_has_a_row_per_gpu_coloured_by_its_ofu(size, request, browser):
    fleet = request.getfixturevalue(size)
    load(browser, fleet.url)
    gpus = fleet.hosts * fleet.per_host
    browser.wait_for(f"document.getElementById('heatmap').dataset.rows === '{gpus}'")
    labels = browser.js("ui.heat.rows.map(r => r.label)")
    assert labels == [f"node-{h:03d} / GPU {i}" for h in range(fleet.hosts) for i in range(fleet.per_host)]
    # the last full column: an idle GPU is drawn at OFU 0, the busiest brighter (pixels read back)
    pixel = """(() => { const c = document.getElementById('heatmap'), m = ui.heat, s = devicePixelRatio;
        const h = heatRowHeight(m.rows.length), w = (m.cssWidth - HEAT_GUTTER) / m.columns;
        return (row) => [...c.getContext('2d').getImageData(Math.floor((HEAT_GUTTER + (m.columns - 1.5) * w) * s),
                                                           Math.floor((row + 0.5) * h * s), 1, 1).data].slice(0, 3); })()"""
    idle = 7  # node-001 / GPU 3 at 4 per host, node-000 / GPU 7 at 8 (one GPU in 23 is idle)
    busiest = max(range(gpus), key=lambda g: 0 if g % 23 == 7 or g < fleet.per_host else (g * 37) % 100)
    assert browser.js(f"({pixel})({idle})") == [68, 1, 84]
    assert sum(browser.js(f"({pixel})({busiest})")) > 300
    if size == "fleet8":
        shoot(browser, "dashboard-8.png")


def test_the_job_page_shows_the_rows_of_kernelfleet_job(fleet8, browser):
    fleet8.pause()  # the store holds still while the page's figures are compared with it
    try:
        check_job_page(fleet8, browser)
    finally:
        fleet8.resume()


def check_job_page(fleet8, browser):
    rows = job_report(fleet8.store.job_report(JOB))
    browser.goto(f"{fleet8.url}#view=job&job={JOB}&below=30")
    browser.wait_for(f"document.querySelectorAll('#job-gpus tbody tr').length === {len(rows.gpus)}")
    catalog = Catalog.load()
    price = {g.name: min(p.usd_per_hour for p in catalog.lookup(g.name).prices) for g in rows.gpus}
    spent = spent_below(rows, 0.3, fleet8.store.job_seconds_below(JOB, 0.3), lambda g: price[g.name])
    assert spent.gpu_hours > 0 and spent.usd > 0  # the slowed host spent minutes below 30 %
    table = browser.js("[...document.querySelectorAll('#job-gpus tbody tr')].map(r => [r.dataset.uuid, "
                       "...[...r.cells].map(c => c.textContent)])")
    # words exactly; figures to the page's two decimals (JavaScript and Python round an exact tie apart)
    assert [[row[0], row[1], row[2], row[3], row[8]] for row in table] == \
        [[g.uuid, f"{g.host} / GPU {g.gpu_index}", g.name, f"{100 * g.ofu_ratio:.1f}%", ""] for g in rows.gpus]
    assert [[float(v) for v in row[4:8]] for row in table] == \
        [pytest.approx([g.seconds / 3600, g.mean_share, s.gpu_hours, s.usd], abs=0.0051)
         for g, s in zip(rows.gpus, spent.gpus, strict=True)]
    assert float(browser.js("document.getElementById('job-hours').textContent").removesuffix(" h")) == \
        pytest.approx(spent.gpu_hours, abs=0.0051)
    assert float(browser.js("document.getElementById('job-usd').textContent").removeprefix("$")) == \
        pytest.approx(spent.usd, abs=0.0051)
    mix = browser.js("[...document.querySelectorAll('#job-mix-list li')].map(li => li.textContent.trim())")
    assert mix == [f"{k} {100 * v:.1f}%" for k, v in rows.bottleneck_shares.items()]
    regressions = browser.js("[...document.querySelectorAll('#job-events li')].map(li => li.textContent)")
    assert len(regressions) == len(rows.events) >= 1 and f"OFU of job {JOB} dropped" in regressions[0]
    shoot(browser, "dashboard-job.png")

    # a price of one's own, and another threshold: the figures follow, from the server
    browser.js("const p = document.getElementById('price'); p.value = '10'; p.dispatchEvent(new Event('change'))")
    browser.wait_for("location.hash.includes('price=10')")
    mine = spent_below(rows, 0.3, fleet8.store.job_seconds_below(JOB, 0.3), lambda g: 10.0)
    browser.wait_for(f"Math.abs(Number(document.getElementById('job-usd').textContent.slice(1)) - {mine.usd}) < 0.0051")
    browser.js("const b = document.getElementById('below'); b.value = '100'; b.dispatchEvent(new Event('change'))")
    browser.wait_for("location.hash.includes('below=100')")
    every = sum(fleet8.store.job_seconds_below(JOB, 1.0).values()) / 3600
    assert every > spent.gpu_hours
    browser.wait_for(f"Math.abs(parseFloat(document.getElementById('job-hours').textContent) - {every}) < 0.0051")


def test_view_selection_and_range_survive_a_reload(fleet8, browser):
    uuid = fleet_gpu(1, 2, 4)[0]
    load(browser, fleet8.url)
    browser.js(f"document.querySelector('#worst tbody tr[data-uuid=\"{uuid}\"]').click()")
    browser.wait_for("document.getElementById('gpu-title').textContent.startsWith('OFU of node-001 / GPU 2')")
    browser.js("document.querySelector('#ranges button[data-range=\"6h\"]').click()")
    browser.wait_for("location.hash.includes('range=6h')")
    before = browser.js("location.hash")
    browser.reload()
    browser.wait_for(LIVE)
    assert browser.js("location.hash") == before
    assert browser.js("document.getElementById('gpu-title').textContent") == "OFU of node-001 / GPU 2 (last 6 h)"
    assert browser.js("document.getElementById('gpu-title').title") == uuid  # the uuid in a tooltip
    assert browser.js("document.querySelector('#ranges button[aria-pressed=\"true\"]').dataset.range") == "6h"
    assert browser.js("document.getElementById('view-fleet').hidden") is True
    assert browser.js("document.querySelector('#gpu-chart canvas') !== null")
    # a shared link to a job page opens the job page
    load(browser, f"{fleet8.url}#view=job&job={JOB}&range=15m&below=50")
    browser.wait_for("document.querySelectorAll('#job-gpus tbody tr').length > 0")
    assert browser.js("document.getElementById('below').value") == "50"
    assert browser.js("document.getElementById('job-chart-title').textContent").endswith("(last 15 min, per minute)")
    # the axis is the range chosen, however few points the job has (one point once drew 2027 to 2029)
    span = browser.wait_for("(s => s.max - s.min)(ui.charts['job-chart'].plot.scales.x)")
    assert span == pytest.approx(900, abs=1)


def test_events_and_titles_name_gpus_by_host_and_index(fleet8, browser):
    load(browser, fleet8.url)
    browser.wait_for("document.querySelectorAll('#events li.regression').length > 1")
    events = browser.js("[...document.querySelectorAll('#events li')].map(li => [li.textContent, li.title])")
    gpu_events = [(text, title) for text, title in events if title]
    assert gpu_events and all("GPU-" not in text and "node-000 / GPU " in text for text, _ in gpu_events)
    assert {title for _, title in gpu_events} <= {fleet_gpu(0, i, 4)[0] for i in range(4)}


def test_a_401_asks_for_the_token_then_shows_the_data(tmp_path, browser):
    fleet = SyntheticFleet(tmp_path, hosts=1, per_host=2, token="s3cret-token")
    try:
        browser.goto(fleet.url)
        browser.wait_for("document.getElementById('token-dialog').open")
        assert "HTTP 401" not in browser.js("document.getElementById('status').textContent")
        assert browser.js("document.getElementById('token-why').textContent") == "This agent wants a bearer token."
        browser.js("document.getElementById('token-input').focus()")
        browser.call("Input.insertText", text="wrong")
        browser.js("document.querySelector('#token-form button').click()")
        browser.wait_for("document.getElementById('token-why').textContent === 'That token was refused.'")
        browser.wait_for("document.getElementById('token-dialog').open")
        browser.js("document.getElementById('token-input').value = ''; document.getElementById('token-input').focus()")
        browser.call("Input.insertText", text="s3cret-token")
        browser.js("document.querySelector('#token-form button').click()")
        browser.wait_for(LIVE)
        assert browser.js("document.getElementById('fleet-gpus').textContent") == "2 / 2"
        assert browser.js("sessionStorage.getItem('kernelfleet-token')") == "s3cret-token"
        assert browser.js("document.getElementById('token-dialog').open") is False
    finally:
        fleet.close()


@pytest.mark.parametrize("size", ["fleet8", "fleet800"])
def test_a_390_px_screen_never_scrolls_sideways(size, request, browser):
    fleet = request.getfixturevalue(size)
    browser.size(390, 844)
    for view in ("", f"#view=job&job={JOB}", f"#view=gpu&host=node-000&gpu={fleet_gpu(0, 1, fleet.per_host)[0]}",
                 "#view=host&host=node-001"):
        load(browser, fleet.url + view)
        assert browser.js("document.documentElement.scrollWidth") <= 390, view
        if size == "fleet8" and view == "":
            shoot(browser, "dashboard-narrow.png")


def test_a_refresh_at_800_gpus_fetches_a_few_kilobytes(fleet800, browser):
    """What the page asks for, as the browser's own resource timing saw it (bytes on the wire,
    compressed, and decoded); ``-s`` prints the table docs/fleet.md quotes."""
    load(browser, fleet800.url)
    browser.wait_for("document.getElementById('heatmap').dataset.rows === '800'")
    browser.js("performance.clearResourceTimings()")
    browser.wait_for("performance.getEntriesByType('resource').filter(e => e.name.includes('/api/events')).length >= 2")
    browser.js("document.querySelector('#ranges button[data-range=\"24h\"]').click()")  # the heatmap and chart again
    browser.wait_for("performance.getEntriesByType('resource').some(e => e.name.includes('/api/heatmap'))")
    browser.wait_for("performance.getEntriesByType('resource').some(e => e.name.includes('/api/fleet/series'))")
    entries = browser.js("performance.getEntriesByType('resource').map(e => [new URL(e.name).pathname, "
                         "e.encodedBodySize, e.decodedBodySize])")
    seen: dict[str, tuple[int, int]] = {}
    for path, wire, body in entries:
        seen.setdefault(path, (wire, body))
    refresh = ["/api/fleet", "/api/overview", "/api/jobs/summary", "/api/events"]
    assert set(refresh) | {"/api/heatmap", "/api/fleet/series"} == set(seen), seen  # never /api/gpus, every GPU's row
    print("\n| request | bytes on the wire | JSON |\n|---|---|---|")
    for path, (wire, body) in seen.items():
        print(f"| `{path}` | {wire / 1000:.1f} kB | {body / 1000:.1f} kB |")
    per_refresh = sum(seen[p][0] for p in refresh)
    print(f"a refresh: {per_refresh / 1000:.1f} kB on the wire; "
          "command: pytest -s tests/e2e/test_dashboard_fleet.py -k kilobytes")
    assert per_refresh < 20_000
    assert seen["/api/heatmap"][0] < seen["/api/heatmap"][1] / 5  # compressed


def test_a_link_to_an_unknown_job_says_so(fleet8, browser):
    browser.goto(f"{fleet8.url}#view=job&job=no-such-job")
    status = browser.wait_for("(t => t.startsWith('no job') && t)(document.getElementById('status').textContent)")
    assert status == "no job no-such-job here (api/report/no-such-job: HTTP 404)"
