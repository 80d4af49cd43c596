"""Benchmark: issue 18's fault campaign re-run on the real agent (``python -m kernelfleet agent``).

    python -m bench.fault_campaign [--quick]

Each scenario runs the agent as a user does, on a free loopback port and a temporary store, and
sets its figure beside the one the issue measured before its fixes:

1. kill -9 of the agent mid-write, N times, each restarted on the same store: windows the agent
   had acknowledged (``/healthz``) but that are not on file, stores that fail SQLite's integrity
   check, and closed minute buckets whose rollup differs from the raw windows under it.
2. K dashboard readers (HTTP clients looping over the dashboard's endpoints) on a day-long 8-GPU
   store while the agent samples 8 GPUs: windows taken against the windows due.
3. A hostile dcgm-exporter for ``--scrape`` (an HTTP server here): a slow-drip body, a 50 MB body,
   a number cut short, duplicate series, out-of-range values, 5,000 bogus UUIDs once, then a GPU
   that leaves. The agent must keep sampling, its memory bounded, bad values kept out, the GPU gone.
4. The fuzz corpora of tests/unit (``test_*fuzz*.py`` and the replay bit flips) and hostile
   recordings given to ``agent --replay``: tracebacks.
5. The agent's peak RSS over the campaign (VmHWM of /proc/PID/status).

The table ends with the command that made it; the last line is JSON with every figure.
``--quick`` runs every scenario smaller, in about two minutes (CI runs it:
tests/unit/test_fault_campaign.py).
"""

from __future__ import annotations

import dataclasses
import gzip
import http.server
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench import Parser, command_line
from bench.fleet_scale import endpoints, synthetic_store
from kernelfleet.fleet.store import Store
from kernelfleet.fleet.store_schema import minutes, span
from kernelfleet.telemetry.replay import ReplaySource, TraceWriter

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "data" / "h200" / "h200-transformer.jsonl.gz"
# What the issue measured before its fixes (issue 18, "What was found"), for the table.
EARLIER = {"kills": "0 lost in 20 kills", "readers_1": "15 of 30 windows", "readers_3": "8 of 30 windows",
           "drip": "sampling blocked 41 s", "huge": "873 MB RSS", "truncated": 'SM clock "19" MHz stored',
           "duplicate": "last wins silently", "range": "negative OFU exported", "bogus": "5,002 rows, 4.1 MB /metrics",
           "fuzz": "20 tracebacks (8 PTX, 12 replay)", "cli": "NaN: agent dies (IntegrityError)", "rss": "873 MB"}
MIB = 1024 * 1024


# -- the agent as a user runs it -------------------------------------------------------------------
def child_env() -> dict[str, str]:
    """This environment, with the repository on the path of the processes started from it."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class RunningAgent:
    process: subprocess.Popen
    url: str
    log: Path
    peak_rss_bytes: int = 0

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except urllib.error.URLError:
            if self.alive():
                raise
            tail = self.log.read_text(errors="replace").strip().splitlines()[-1:]
            raise SystemExit(f"the agent died during the campaign: {' '.join(tail)}") from None

    def windows(self) -> int:
        return json.loads(self.get("/healthz")[1])["windows"]

    def rss(self) -> int:
        """Peak RSS so far, kept after the process is gone."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_bytes = max(self.peak_rss_bytes, int(line.split()[1]) * 1024)
        except FileNotFoundError:
            pass
        return self.peak_rss_bytes

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        self.rss()
        self.process.send_signal(signal.SIGINT)  # what Ctrl-C does: the agent closes its store
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start_agent(tmp: Path, name: str, *args: str) -> RunningAgent:
    port = free_port()
    log = tmp / f"{name}.log"
    with open(log, "ab") as err:
        process = subprocess.Popen([sys.executable, "-m", "kernelfleet", "agent", "--listen", f"127.0.0.1:{port}", *args],
                                   cwd=ROOT, env=child_env(), stdout=err, stderr=err)
    agent = RunningAgent(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while True:
        try:
            agent.windows()
            return agent
        except OSError:
            if not agent.alive() or time.monotonic() > deadline:
                agent.process.kill()
                raise SystemExit(f"the agent did not start: {log.read_text()[-500:]}") from None
            time.sleep(0.05)


def make_trace(path: Path, gpus: int, windows: int, window_seconds: float) -> Path:
    """The H200 transformer recording spread over ``gpus`` GPUs and ``windows`` windows of
    ``window_seconds``, written as the recorder writes it."""
    recorded = [batch[0] for batch in ReplaySource(RECORDING).batches()]
    start = recorded[0].timestamp_seconds
    with TraceWriter(path, note="fault campaign") as trace:
        for w in range(windows):
            sample = recorded[w % len(recorded)]
            trace.write([dataclasses.replace(sample, gpu_index=g, uuid=f"GPU-campaign-{g}", window_seconds=window_seconds,
                                             timestamp_seconds=start + w * window_seconds) for g in range(gpus)])
    return path


def tracebacks(tmp: Path) -> int:
    return sum(log.read_text(errors="replace").count("Traceback (most recent call last)") for log in tmp.glob("*.log"))


# -- 1. kill -9 mid-write --------------------------------------------------------------------------
def kills(tmp: Path, tries: int, settle_seconds: float, rng: random.Random) -> dict[str, Any]:
    trace = make_trace(tmp / "kill.jsonl.gz", gpus=4, windows=600, window_seconds=0.1)
    store = tmp / "kill.db"
    acknowledged = lost = corrupt = 0
    peak = 0
    for k in range(tries):
        started = time.time()
        agent = start_agent(tmp, f"kill-{k}", "--replay", str(trace), "--speed", "1", "--store", str(store))
        time.sleep(rng.uniform(0.3, 2.0))  # ten windows a second: a kill lands at any point of a write
        seen = agent.windows()
        agent.rss()
        agent.process.kill()
        agent.process.wait()
        peak = max(peak, agent.peak_rss_bytes)
        acknowledged += seen
        with sqlite3.connect(store) as db:  # the kill's own windows: those dated since its start
            stored = db.execute("SELECT COUNT(DISTINCT ts) FROM samples WHERE ts >= ?", (started,)).fetchone()[0]
            corrupt += db.execute("PRAGMA integrity_check").fetchone()[0] != "ok"
        lost += max(0, seen - stored)
    # A clean restart after the last kill, left to run until the minute of the kills closes (or
    # ``settle_seconds``): the minutes the killed writers left open are then rolled by the next.
    last = time.time()
    agent = start_agent(tmp, "kill-settle", "--replay", str(trace), "--speed", "1", "--store", str(store))
    while time.time() < last + settle_seconds and rolled_until(store) <= last:
        time.sleep(0.5)
    agent.stop()
    checked, inconsistent = rollups(store)
    return {"tries": tries, "windows_acknowledged": acknowledged, "windows_lost": lost, "corrupt_stores": corrupt,
            "rollup_buckets_checked": checked, "rollup_buckets_inconsistent": inconsistent, "peak_rss_bytes": peak}


def rolled_until(path: Path) -> float:
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'rolled_until'").fetchone()
    return float(row[0]) if row else float("-inf")


def rollups(path: Path) -> tuple[int, int]:
    """Closed minute buckets, and those whose rollup differs from (or lacks) its raw windows."""
    rolled = rolled_until(path)
    with sqlite3.connect(path) as db:
        first = db.execute("SELECT MIN(ts) FROM samples").fetchone()[0]
        if first is None or rolled == float("-inf"):
            return 0, 0
        raw = {(g, b): s for g, b, s in db.execute(f"SELECT gpu_id, bucket, seconds FROM ({minutes()})",
                                                   span(first // 60 * 60, rolled))}
        kept = {(g, b): s for g, b, s in db.execute("SELECT gpu_id, bucket, seconds FROM rollup_1m WHERE bucket < ?",
                                                    (rolled,))}
    bad = sum(abs(kept.get(key, -1.0) - seconds) > 1e-6 for key, seconds in raw.items()) + len(kept.keys() - raw.keys())
    return len(raw), bad


# -- 2. dashboards while sampling ------------------------------------------------------------------
def readers(tmp: Path, counts: list[int], seconds: float) -> dict[str, Any]:
    window = 0.5
    trace = make_trace(tmp / "readers.jsonl.gz", gpus=8, windows=int(len(counts) * seconds / window) + 60,
                       window_seconds=window)
    end = time.time()
    synthetic_store(tmp / "readers.db", 8, 86400, end).close()  # a day-long 8-GPU job, as the issue measured
    paths = endpoints("GPU-00000", "job-0", end)
    loop = [paths[name] for name in ("/api/fleet", "/api/gpus", "/api/jobs/summary", "/api/series (24 h at 1 min)",
                                     "/api/jobs/JOB (a job of 8 GPUs)", "/api/fleet/series (24 h)")]
    agent = start_agent(tmp, "readers", "--replay", str(trace), "--speed", "1", "--store", str(tmp / "readers.db"))
    phases = []
    for count in counts:
        stop = threading.Event()
        done = [[0, 0] for _ in range(count)]  # requests, errors per reader

        def read(tally: list[int], stop: threading.Event = stop) -> None:
            while not stop.is_set():
                for path in loop:
                    tally[0] += 1
                    tally[1] += agent.get(path)[0] != 200

        threads = [threading.Thread(target=read, args=(tally,)) for tally in done]
        for thread in threads:
            thread.start()
        before, t0 = agent.windows(), time.monotonic()
        time.sleep(seconds)
        taken, elapsed = agent.windows() - before, time.monotonic() - t0
        stop.set()
        for thread in threads:
            thread.join()
        due = round(elapsed / window)
        phases.append({"readers": count, "seconds": round(elapsed, 1), "windows_due": due, "windows_taken": taken,
                       "windows_missed": max(0, due - taken), "requests": sum(t[0] for t in done),
                       "request_errors": sum(t[1] for t in done)})
    alive = agent.alive()
    agent.stop()
    return {"phases": phases, "agent_alive": alive, "peak_rss_bytes": agent.peak_rss_bytes}


# -- 3. a hostile dcgm-exporter --------------------------------------------------------------------
def exposition(gpus: list[str], tensor: float = 0.5, clock: str = "1980", power: float = 650.0,
               twice: bool = False) -> bytes:
    """dcgm-exporter's text for ``gpus`` (UUIDs); ``twice`` repeats every series with other values."""
    lines = []
    for field_name, value in (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", str(tensor)), ("DCGM_FI_DEV_POWER_USAGE", str(power)),
                              ("DCGM_FI_DEV_MAX_SM_CLOCK", "1980"), ("DCGM_FI_DEV_SM_CLOCK", clock)):
        lines.append(f"# TYPE {field_name} gauge")
        for i, uuid in enumerate(gpus):
            labels = f'gpu="{i}",UUID="{uuid}",modelName="NVIDIA H200",Hostname="campaign-node"'
            lines.append(f"{field_name}{{{labels}}} {value}")
            if twice:
                lines.append(f"{field_name}{{{labels}}} 0.{i + 1}")
    return ("\n".join(lines) + "\n").encode()


GOOD = ["GPU-scrape-a", "GPU-scrape-b"]
BODIES = {  # phase -> what every scrape gets (drip and huge are written as they are sent)
    "good": exposition(GOOD),
    "truncated": exposition(GOOD)[:-3],  # "... 1980\n" cut to "... 19"
    "duplicate": exposition(GOOD, twice=True),
    "range": exposition(GOOD, tensor=1.7, clock="-5", power=1e9),
    "bogus": exposition([f"GPU-bogus-{i:04d}" for i in range(5000)]),
    "leave": exposition(GOOD[:1]),
}


class Exporter(http.server.ThreadingHTTPServer):
    daemon_threads = True
    phase = "good"
    served: dict[str, int]  # scrapes answered in each phase


class ExporterHandler(http.server.BaseHTTPRequestHandler):
    server: Exporter

    def do_GET(self) -> None:
        phase = self.server.phase
        self.server.served[phase] = self.server.served.get(phase, 0) + 1
        if phase == "bogus":  # 5,000 UUIDs once, then the node as it was
            self.server.phase = "good"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        try:
            if phase == "drip":  # a byte every half second, for longer than any deadline
                for byte in BODIES["good"][:120]:
                    if self.server.phase != "drip":
                        break  # the body ends cut short: the next phase need not wait out this one
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.5)
            elif phase == "huge":  # 50 MB, no Content-Length: the cap must hold while reading
                chunk = b"# " + b"x" * (MIB - 3) + b"\n"
                for _ in range(50):
                    self.wfile.write(chunk)
            else:
                self.wfile.write(BODIES[phase])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent hung up: what it should do

    def log_message(self, *args: Any) -> None:
        pass


def hostile_scrape(tmp: Path, seconds: dict[str, float]) -> dict[str, Any]:
    exporter = Exporter(("127.0.0.1", 0), ExporterHandler)
    exporter.served = {}
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    expire = seconds["leave"] / 2
    agent = start_agent(tmp, "scrape", "--scrape", f"http://127.0.0.1:{exporter.server_address[1]}/metrics",
                        "--interval", "0.5", "--expire", str(expire), "--store", str(tmp / "scrape.db"))
    phases: dict[str, Any] = {}
    longest_gap, gpus_max = 0.0, 0
    gone = None  # seconds into the leave phase when the GPU that left was forgotten
    for phase, length in seconds.items():
        exporter.phase = phase
        least = 1 if phase == "bogus" else 2  # the bogus answer is given once
        before, t0 = agent.windows(), time.monotonic()
        last, last_change = before, t0
        # A phase lasts its length and until the agent has scraped it (twice; the bogus answer,
        # given once, once): a drip holds a scrape up to the deadline, into the next phase. The leave
        # phase lasts until the GPU that left is gone too: the agent forgets it on its first window
        # past --expire, and on a loaded machine that window comes late.
        while (time.monotonic() - t0 < length or exporter.served.get(phase, 0) < least
               or (phase == "leave" and gone is None)) and time.monotonic() - t0 < 60:
            time.sleep(0.2)
            now_windows = agent.windows()
            if now_windows != last:
                longest_gap = max(longest_gap, time.monotonic() - last_change)
                last, last_change = now_windows, time.monotonic()
            total = json.loads(agent.get("/api/gpus")[1])["total"]
            gpus_max = max(gpus_max, total)
            if phase == "leave" and gone is None and total < len(GOOD):
                gone = time.monotonic() - t0
        longest_gap = max(longest_gap, time.monotonic() - last_change)
        gpus = json.loads(agent.get("/api/gpus")[1])["total"]  # a hostile exporter's GPUs may pass a page
        metrics = agent.get("/metrics")[1].decode()
        phases[phase] = {"seconds": length, "windows": agent.windows() - before, "alive": agent.alive(),
                         "rss_bytes": agent.rss(), "gpus": gpus, "metrics_bytes": len(metrics),
                         "negative_ofu_lines": sum(line.startswith("kernelfleet_ofu") and line.split()[-1].startswith("-")
                                                   for line in metrics.splitlines())}
    alive = agent.alive()
    agent.stop()
    exporter.shutdown()
    with sqlite3.connect(tmp / "scrape.db") as db:
        bad = db.execute("SELECT COUNT(*) FROM samples WHERE ofu < 0 OR tensor_active > 1 OR tensor_active < 0 "
                         "OR sm_clock_hertz < 1e8 OR power_watts > 5000").fetchone()[0]
    log = agent.log.read_text(errors="replace")
    return {"phases": phases, "longest_gap_seconds": round(longest_gap, 1), "gpus_max": gpus_max,
            "bad_values_stored": bad, "agent_alive": alive, "peak_rss_bytes": agent.peak_rss_bytes,
            "expire_seconds": expire, "gone_after_seconds": None if gone is None else round(gone, 1),
            "rejections_logged": sorted({kind for kind in ("out of range", "duplicate") if f"{kind} value(s) rejected" in log}),
            "failed_scrapes_logged": log.count("scrape failed:")}


# -- 4. fuzz corpora and hostile recordings --------------------------------------------------------
def fuzz(tmp: Path) -> dict[str, Any]:
    corpora = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "unit").glob("test_*fuzz*.py"))
    flips = "tests/unit/test_replay.py::test_every_bit_flip_of_a_recording_reads_or_fails_in_one_line"
    report = tmp / "fuzz.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *corpora,
                    flips], cwd=ROOT, env=child_env(), capture_output=True, timeout=600, check=False)
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, "pytest wrote no test suite"
    tests, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return {"corpora": [*corpora, flips], "tests": tests, "failed": failed, **hostile_recordings(tmp)}


def hostile_recordings(tmp: Path) -> dict[str, Any]:
    """``agent --replay`` on recordings the issue saw kill it: each must end in one line, exit non-zero."""
    good = RECORDING.read_bytes()
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0x10
    lines = gzip.decompress(good).decode().splitlines()
    sample = json.loads(lines[1])

    def with_value(name: str, value: str) -> bytes:
        first = dict(sample["samples"][0], **{name: "VALUE"})
        text = json.dumps({"samples": [first]}).replace('"VALUE"', value)
        return gzip.compress("\n".join([lines[0], text, *lines[2:]]).encode() + b"\n")

    cases = {"a bit flipped": bytes(flipped), "a timestamp of Infinity": with_value("timestamp_seconds", "Infinity"),
             "a tensor ratio of NaN": with_value("tensor_active_ratio", "NaN"), "cut short": good[: len(good) // 3]}
    results = {}
    for name, data in cases.items():
        path = tmp / f"hostile-{len(results)}.jsonl.gz"
        path.write_bytes(data)
        log = tmp / f"hostile-{len(results)}.log"
        done = subprocess.run([sys.executable, "-m", "kernelfleet", "agent", "--replay", str(path), "--speed", "100",
                               "--store", str(tmp / "hostile.db"), "--listen", f"127.0.0.1:{free_port()}"],
                              cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120, check=False)
        log.write_text(done.stderr)
        errors = [line for line in done.stderr.splitlines() if line.startswith("kernelfleet: ")]
        results[name] = {"rc": done.returncode, "traceback": "Traceback" in done.stderr, "error": errors[-1] if errors else None}
    return {"recordings": results, "recording_tracebacks": sum(r["traceback"] for r in results.values())}


# -- the campaign ----------------------------------------------------------------------------------
def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every scenario smaller, in about two minutes (CI)")
    args = parser.parse_args()
    print(f"command: {command_line()}")
    rng = random.Random(18)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        result: dict[str, Any] = {"command": command_line(), "quick": args.quick}
        result["kills"] = kills(tmp, 4 if args.quick else 20, 5.0 if args.quick else 70.0, rng)
        result["readers"] = readers(tmp, [0, 3] if args.quick else [0, 1, 3], 8.0 if args.quick else 30.0)
        short = 2.0 if args.quick else 5.0
        result["scrape"] = hostile_scrape(tmp, {"good": short, "drip": 11.0, "huge": short, "truncated": short,
                                                "duplicate": short, "range": short, "bogus": short, "leave": 2 * short})
        result["fuzz"] = fuzz(tmp)
        result["tracebacks"] = tracebacks(tmp) + result["fuzz"]["failed"]
        result["max_rss_bytes"] = max(result[s]["peak_rss_bytes"] for s in ("kills", "readers", "scrape"))
        result["agent_alive"] = result["readers"]["agent_alive"] and result["scrape"]["agent_alive"]
        try:
            Store(tmp / "kill.db").close()
            result["store_opens"] = True
        except Exception:  # noqa: BLE001 (any failure to open is the figure)
            result["store_opens"] = False
    print_table(result)
    print(json.dumps(result))


def print_table(r: dict[str, Any]) -> None:
    k, s, f = r["kills"], r["scrape"], r["fuzz"]
    p = s["phases"]
    rows = [("kill -9 mid-write", (f"{k['windows_lost']} of {k['windows_acknowledged']} windows lost in {k['tries']} kills; "
             f"{k['corrupt_stores']} corrupt; {k['rollup_buckets_inconsistent']} of {k['rollup_buckets_checked']} "
             "minute rollups off"), EARLIER["kills"],
             k["windows_lost"] == k["corrupt_stores"] == k["rollup_buckets_inconsistent"] == 0)]
    for phase in r["readers"]["phases"]:
        n = phase["readers"]
        rows.append((f"{n} dashboard readers while sampling",
                     (f"{phase['windows_taken']} of {phase['windows_due']} windows ({phase['requests']} requests, "
                     f"{phase['request_errors']} errors)"), EARLIER.get(f"readers_{n}", "-"),
                     phase["windows_taken"] >= 0.9 * phase["windows_due"] and phase["request_errors"] == 0))
    rows += [
        ("scrape: slow-drip body", f"longest gap between windows {s['longest_gap_seconds']} s", EARLIER["drip"],
         s["longest_gap_seconds"] <= 15),
        ("scrape: 50 MB body", f"agent RSS {p['huge']['rss_bytes'] / MIB:.0f} MiB", EARLIER["huge"],
         p["huge"]["rss_bytes"] < 300 * MIB),
        ("scrape: number cut short", f"{p['truncated']['windows']} windows, {s['bad_values_stored']} bad values stored",
         EARLIER["truncated"], s["bad_values_stored"] == 0),
        ("scrape: duplicate series", f"rejections logged: {', '.join(s['rejections_logged']) or 'none'}",
         EARLIER["duplicate"], "duplicate" in s["rejections_logged"]),
        ("scrape: out-of-range values", f"{p['range']['negative_ofu_lines']} negative OFU lines in /metrics",
         EARLIER["range"], p["range"]["negative_ofu_lines"] == 0 and "out of range" in s["rejections_logged"]),
        ("scrape: 5,000 bogus UUIDs once", f"at most {s['gpus_max']} GPUs; /metrics {p['bogus']['metrics_bytes'] / 1024:.1f} KiB",
         EARLIER["bogus"], s["gpus_max"] <= len(GOOD)),
        ("scrape: a GPU leaves", f"{p['leave']['gpus']} GPU left; the other forgotten "
         + ("never" if s["gone_after_seconds"] is None else f"{s['gone_after_seconds']:g} s after it left")
         + f" (--expire {s['expire_seconds']:g} s)", "never expired", p["leave"]["gpus"] == 1),
        ("fuzz corpora (pytest)", f"{f['failed']} tracebacks in {f['tests']} tests", EARLIER["fuzz"], f["failed"] == 0),
        ("hostile recordings to agent --replay", (f"{f['recording_tracebacks']} tracebacks in {len(f['recordings'])}; "
         f"non-zero exits {sum(x['rc'] != 0 for x in f['recordings'].values())}"), EARLIER["cli"],
         f["recording_tracebacks"] == 0),
        ("tracebacks in every agent's log", str(r["tracebacks"]), "-", r["tracebacks"] == 0),
        ("agent peak RSS over the campaign", f"{r['max_rss_bytes'] / MIB:.0f} MiB", EARLIER["rss"], r["max_rss_bytes"] < 300 * MIB),
    ]
    print(f"{'scenario':38} {'figure':72} {'earlier (issue 18)':34} verdict")
    for scenario, figure, earlier, ok in rows:
        print(f"{scenario:38} {figure:72} {earlier:34} {'pass' if ok else 'FAIL'}")
    for name, rec in f["recordings"].items():
        print(f"  agent --replay, {name}: exit {rec['rc']}, {rec['error']}")


if __name__ == "__main__":
    main()
