import re
import shutil
import socket
import time
from pathlib import Path

import pytest
import yaml

from kernelfleet.fleet.exporter import OfuCollector

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules.yml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str:
    """A system binary the e2e tests need; missing is a failure (make test installs it), not a skip."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: `make test` installs it (Debian package prometheus)")
    return path


def wait_http(url: str, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def until(value, what: str, timeout: float = 60.0):
    """``value()`` once it is truthy; fails saying ``what`` did not happen after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (got := value()):
        if time.monotonic() > deadline:
            pytest.fail(what)
        time.sleep(0.5)
    return got


class Tmux:
    """A real terminal: a detached tmux session ``width`` x ``height`` running ``command`` in bash, on a
    tmux server of its own (``-L``), so no other tmux on the machine is touched."""

    def __init__(self, command: str, width: int, height: int, cwd: str) -> None:
        import subprocess
        import uuid

        self._run = subprocess.run
        self.socket = f"kf-test-{uuid.uuid4().hex[:12]}"  # a server per terminal: a killed one never lingers into the next
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), "-c", cwd, command)

    def _tmux(self, *args: str) -> str:
        done = self._run([binary("tmux"), "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def capture(self, escapes: bool = False) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t", *(["-e"] if escapes else []))

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def alternate_screen(self) -> bool:
        return self._tmux("display-message", "-p", "-t", "t", "#{alternate_on}").strip() == "1"

    def wait_for(self, ready, timeout: float = 60.0) -> str:
        """The pane's text once ``ready(text)`` holds; fails with the last text after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.capture()
            if ready(text):
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"the terminal never showed what was waited for; it shows:\n{text}")
            time.sleep(0.2)

    def close(self) -> None:
        self._run([binary("tmux"), "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def load_yaml(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


# Metric names: what the exporter defines, what the rules record, what PromQL uses (the deploy and
# Grafana tests check that every query selects only series that exist).

def exporter_metric_names() -> set[str]:
    """Series names the agent exposes, from the collector itself (no GPU needed)."""
    names = set()
    for family in OfuCollector(list, process_series_per_gpu=1).collect():
        suffix = {"gauge": "", "info": "_info", "counter": "_total"}  # what each type's series is named
        assert family.type in suffix, f"update this test for {family.type} {family.name}"
        names.add(family.name + suffix[family.type])
    assert {"kernelfleet_ofu_ratio", "kernelfleet_gpu_info", "kernelfleet_job_info"} <= names
    return names


def serve_metric_names() -> set[str]:
    """Series names ``kernelfleet serve`` exposes, from its own registry (no model needed)."""
    from kernelfleet.serve.metrics import ServeMetrics

    suffixes = {"gauge": [""], "counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    names = {family.name + suffix for family in ServeMetrics(max_queue=1).registry.collect()
             for suffix in suffixes[family.type]}
    assert "kernelfleet_serve_time_per_output_token_seconds_bucket" in names
    return names


def rule_groups() -> list[dict]:
    (doc,) = load_yaml(RULES)
    return doc["groups"]


def recorded_names() -> set[str]:
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


_PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                    "group_left", "group_right", "inf", "nan", "atan2", "start", "end"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (Grafana template variables allowed)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    s = re.sub(r"\$\{[^}]*\}|\$\w+", "", s)  # $var, ${var}
    s = re.sub(r"\{[^{}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\[\]]*\]", "", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    s = re.sub(r"(?<![\w:])[0-9][0-9a-zA-Z_.+-]*", " ", s)  # numbers, durations
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("("):
            continue  # a function
        if m.group() not in _PROMQL_KEYWORDS:
            names.add(m.group())
    return names


# -- a real browser driven over the DevTools protocol ------------------------------------------------

class Browser:
    """Headless Chromium with one page, driven over the Chrome DevTools Protocol: navigate, run a
    script in the page, wait for a condition, size the window, take a screenshot."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        import json
        import subprocess
        import urllib.request

        import websocket

        self.proc = subprocess.Popen(
            [binary("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--remote-debugging-port=0", f"--window-size={width},{height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                pytest.fail("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        target = next(p for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self._id = 0
        self.console: list[str] = []
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.size(width, height)

    def call(self, method: str, **params):
        import json

        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("method") == "Runtime.exceptionThrown":
                self.console.append("exception: " + message["params"]["exceptionDetails"].get("text", ""))
            if message.get("method") == "Runtime.consoleAPICalled" and message["params"]["type"] in ("error", "assert"):
                self.console.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                           for a in message["params"]["args"]))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def size(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def reload(self) -> None:
        self.call("Page.reload", ignoreCache=True)

    def js(self, expression: str):
        """The value of ``expression`` in the page (awaited if it is a promise), as JSON gives it."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0):
        """The value of ``expression`` once it is truthy; fails with what the page shows after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(expression)
            except RuntimeError:
                value = None  # the page is navigating
            if value:
                return value
            if time.monotonic() > deadline:
                status = self.js("document.getElementById('status') && document.getElementById('status').textContent")
                pytest.fail(f"the page never satisfied {expression}; its status: {status!r}; console: {self.console}")
            time.sleep(0.2)

    def screenshot(self, path: Path, full_page: bool = True) -> None:
        import base64

        params = {"format": "png", "captureBeyondViewport": full_page}
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.kill()
        self.proc.wait(timeout=30)


# -- a fleet of synthetic GPUs through the real agent, store and server --------------------------------

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
HISTORY_WINDOWS, HISTORY_STEP_SECONDS = 90, 40  # an hour of history before the fleet goes live
SLOW_FROM_WINDOW = 60  # the first host slows down from here (a regression of its GPUs and its job)


def fleet_gpu(host: int, index: int, per_host: int) -> tuple[str, str]:
    """A synthetic GPU's uuid and NVML name: even hosts hold H100s, odd ones H200s (a mixed fleet)."""
    return f"GPU-{host:03d}{index:02d}-5e1f-4c0a-9d1b-{host * per_host + index:012d}", H100 if host % 2 == 0 else H200


def fleet_batch(hosts: int, per_host: int, window: int, ts: float, window_seconds: float) -> list:
    """One window of every GPU: tensor activity spread over the fleet by a fixed pattern, one GPU in
    23 idle, a job per two hosts, the first host slowed to 40 % from SLOW_FROM_WINDOW."""
    from kernelfleet.telemetry.sample import ProcessSample, Sample

    batch = []
    for h in range(hosts):
        for i in range(per_host):
            g = h * per_host + i
            uuid, name = fleet_gpu(h, i, per_host)
            idle = g % 23 == 7
            tensor = 0.0 if idle else 0.12 + 0.8 * ((g * 37) % 100) / 100
            if h == 0 and window >= SLOW_FROM_WINDOW:
                tensor *= 0.4
            batch.append(Sample(
                timestamp_seconds=ts, window_seconds=window_seconds, gpu_index=i, uuid=uuid, name=name,
                tensor_active_ratio=tensor, hmma_active_ratio=tensor, sm_active_ratio=0.02 if idle else 0.92,
                sm_occupancy_ratio=0.01 if idle else 0.35, dram_bandwidth_ratio=0.0 if idle else 0.25 + 0.5 * (g % 3) / 3,
                sm_clock_mean_hertz=1.98e9, power_mean_watts=90.0 if idle else 640.0,
                processes=() if idle else (ProcessSample(pid=1000 + h // 2, name="train"),)))
    return batch


class SyntheticFleet:
    """``hosts`` x ``per_host`` GPUs through the real Agent (a host per GPU, as a Kubernetes-wide agent
    sees them), its SQLite store and its HTTP server on a free loopback port: an hour of history,
    then a window every second until closed, so the page is live."""

    def __init__(self, tmp: Path, hosts: int, per_host: int, token: str | None = None) -> None:
        import threading

        from kernelfleet.catalog import Catalog
        from kernelfleet.fleet.agent import Agent, attribute_recorded
        from kernelfleet.fleet.listener import Listener, bind
        from kernelfleet.fleet.server import agent_app
        from kernelfleet.fleet.store import Store

        self.hosts, self.per_host = hosts, per_host
        names = {(fleet_gpu(h, i, per_host)[0], None): f"node-{h:03d}" for h in range(hosts) for i in range(per_host)}
        self.store = Store(tmp / "fleet.db")
        self.agent = Agent(source=None, store=self.store, catalog=Catalog.load(), host="unused",
                           identify=attribute_recorded, hosts=lambda: names)
        now = time.time()
        for w in range(HISTORY_WINDOWS):
            self.agent.step(fleet_batch(hosts, per_host, w, now - (HISTORY_WINDOWS - w) * HISTORY_STEP_SECONDS,
                                        HISTORY_STEP_SECONDS))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.server = Listener(agent_app(self.agent, self.store, token), bind("127.0.0.1", self.port)).start()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._stepping = threading.Lock()  # held while a live window is written
        self._thread = threading.Thread(target=self._live, daemon=True)
        self._thread.start()

    def _live(self) -> None:
        while not self._stop.wait(1.0):
            with self._stepping:
                if not self._paused.is_set():
                    self.agent.step(fleet_batch(self.hosts, self.per_host, HISTORY_WINDOWS, time.time(), 1.0))

    def pause(self) -> None:
        """No new window from now on (one being written is finished first): what the page shows holds still."""
        with self._stepping:
            self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.server.stop()
        self.store.close()


# Grafana dashboards against a real Prometheus (tests/e2e/test_grafana_*.py)

RANGE_SECONDS = 120  # what the tests stand in for Grafana's $__range, and the range queries span
# Grafana's own variables ($__range, ${__field.labels.x}, ...) and label_replace's capture groups ($1).
BUILTIN_VARIABLE = re.compile(r"__\w+|\d+")
_VARIABLE = re.compile(r"\$\{(\w+)[^}]*\}|\$(\w+)")


def panels(items: list[dict]):
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard_targets(board: dict) -> list[tuple[str, dict, dict]]:
    """(where, panel, target) for every panel query of ``board``."""
    return [(f"{p['title']} {t['refId']}", p, t) for p in panels(board["panels"]) if p["type"] != "row"
            for t in p["targets"]]


def assert_panels_tile_the_grid(board: dict) -> None:
    """Every panel of ``board`` has its own id, fits the 24 columns and overlaps no other."""
    every = list(panels(board["panels"]))
    assert len({p["id"] for p in every}) == len(every), "panel ids must be unique"
    taken: dict[tuple[int, int], str] = {}
    for panel in every:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        for cell in ((x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])):
            assert cell not in taken, f"{panel['title']} overlaps {taken[cell]}"
            taken[cell] = panel["title"]


def dashboard_variables(board: dict) -> dict[str, dict]:
    return {v["name"]: v for v in board["templating"]["list"]}


def variable_query(var: dict) -> str:
    return var["query"]["query"] if isinstance(var["query"], dict) else var["query"]


def used_variables(text: str) -> set[str]:
    return {a or b for a, b in _VARIABLE.findall(text)}


def grafana_expr(expr: str, values: dict[str, str]) -> str:
    """``expr`` as Grafana sends it: its variables replaced by regexes (or k), its builtins by the range."""
    expr = re.sub(r"\$__range\b", f"{RANGE_SECONDS}s", expr)
    return _VARIABLE.sub(lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expr)


def start_prometheus(tmp_path: Path, target_port: int, interval: str, job: str = "kernelfleet",
                     labels: str = "{}"):
    """A real Prometheus evaluating rules.yml, scraping ``target_port`` as ``job`` with the target
    ``labels`` (YAML flow mapping); (its process, its base URL)."""
    import subprocess

    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        f"rule_files: ['{RULES}']\nscrape_configs:\n  - job_name: {job}\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n        labels: {labels}\n")
    prom = subprocess.Popen(
        [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60)
    return prom, f"http://127.0.0.1:{port}"


def query(base: str, expr: str, instant: bool) -> list[dict]:
    """The result of ``expr`` over the last RANGE_SECONDS (or now, for an instant query); a PromQL error fails."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    now = time.time()
    params = {"query": expr, "time": now} if instant else {
        "query": expr, "start": now - RANGE_SECONDS, "end": now, "step": 5}
    url = f"{base}/api/v1/{'query' if instant else 'query_range'}?" + urllib.parse.urlencode(params)
    try:
        body = json.loads(urllib.request.urlopen(url, timeout=30).read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
    assert body["status"] == "success", f"{body.get('error')}: {expr}"
    return body["data"]["result"]
