"""The opt-in hook on a real GPU job, against the real agent (issue 4).

    KERNELFLEET_JOB=hook-check python -m bench.hook_check run --out DIR [--phase-seconds 22]
    python -m bench.hook_check run --out DIR --dry-run     # on a CPU: the same path on a recording
    python -m bench.hook_check summary --out DIR           # anywhere: the table from the files

Starts the agent as a GPU machine runs it (``python -m kernelfleet agent``: NVML and GPM, 1-s
windows, its store, the API on 127.0.0.1:9400 that ``kernelfleet.hook`` posts to; where fastapi or
uvicorn is missing, the same ``fleet.agent.Agent`` on the same NVML source behind a small stdlib
endpoint, and the output says so). Then trains a bf16 MLP whose GEMMs are no tile multiples
(tokens 8200, widths 1000 and 3000) with ``kernelfleet.hook.Tracker`` in two phases: (a) the job
reports an honest MFU, its useful FLOPs over CUDA-event step times in the last second; (b) twice
that, as a framework that counts every FLOP twice would. The agent must flag (b) and not (a).

Each phase's Tracker profiles its first counted step (the tile correction: matmuls paired with the
GEMM kernels that ran them); the script records that step's calls, kernels and pairing beside the
Tracker's own figures. Reports go to the agent every 2.5 s through the Tracker's ``send``, which
posts as ``hook.post_json`` does and keeps the agent's answer.

Writes into DIR: hook-run.json (model, FLOPs, the profiled steps, agent path), hook-timeline.json.gz
(each phase's CUDA-event step ends, as a sweep point's timeline), hook-reports.jsonl (every report
and the agent's answer), agent-windows.jsonl and agent-events.json (the agent's store), summary.json,
agent.log, agent.db. ``tests/replay/test_hook_h200.py`` reads them from tests/data/h200-hook/ (all but
agent.db). ``summary`` prints the table again, recomputing the windows' OFU with today's catalog, and
leaves the run's own summary.json as it was.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import Parser, command_line

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "data" / "h200-detector" / "h200-drop.jsonl.gz"  # the dry run's "GPU"
# The MLP: no dimension a multiple of a GEMM tile, so the executed FLOPs exceed the useful ones.
GPU_SHAPE = {"tokens": 8200, "width": 1000, "hidden": 3000, "blocks": 4}
DRY_SHAPE = {"tokens": 82, "width": 10, "hidden": 30, "blocks": 2}
PHASES = (("honest", 1.0), ("doubled", 2.0))  # reported MFU = factor x the step-timed MFU
EVERY, REPORT_SECONDS, STEADY_AFTER_SECONDS = 10, 2.5, 1.5


def useful_flops_per_step(tokens: int, width: int, hidden: int, blocks: int) -> int:
    """Forward, weight-gradient and input-gradient GEMMs of every Linear, less the first layer's input
    gradient (the data needs none): 2·T·W·H per GEMM, (6 · blocks − 1) GEMMs."""
    return 2 * tokens * width * hidden * (6 * blocks - 1)


# --- the agent ------------------------------------------------------------------------------------


def start_agent(out: Path, port: int, dry_run: bool) -> tuple[subprocess.Popen, str]:
    real = not dry_run and all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "pydantic"))
    for use_real in ((True, False) if real else (False,)):
        if use_real:
            cmd = [sys.executable, "-m", "kernelfleet", "agent", "--store", str(out / "agent.db"),
                   "--listen", f"127.0.0.1:{port}"]
            path = "kernelfleet agent (NVML, uvicorn, POST /api/hook)"
        else:
            cmd = [sys.executable, "-m", "bench.hook_check", "serve-agent", "--store", str(out / "agent.db"),
                   "--port", str(port)]
            cmd += ["--replay", str(RECORDING)] if dry_run else []
            path = ("stdlib endpoint, fleet.agent.Agent on a replayed H200 recording (dry run)" if dry_run else
                    "stdlib endpoint, fleet.agent.Agent on NvmlSource (fastapi/uvicorn/pydantic missing here)")
        for f in out.glob("agent.db*"):
            f.unlink()
        agent = subprocess.Popen(cmd, stdout=(out / "agent.log").open("a"), stderr=subprocess.STDOUT,
                                 start_new_session=True)
        if wait_healthy(f"http://127.0.0.1:{port}", agent, 45.0):
            return agent, path
        stop_agent(agent)
        print(f"agent did not come up: {' '.join(cmd)} (see agent.log)", file=sys.stderr, flush=True)
    raise SystemExit("no agent: see agent.log")


def wait_healthy(url: str, agent: subprocess.Popen, seconds: float) -> bool:
    """Until the agent answers /healthz with two windows done (its jobs are known by then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and agent.poll() is None:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as answer:
                if json.load(answer).get("windows", 0) >= 2:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def stop_agent(agent: subprocess.Popen) -> None:
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGINT)  # the agent closes its store on Ctrl-C
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)


def serve_agent(store_path: Path, port: int, replay: Path | None) -> None:
    """The agent without fastapi: ``fleet.agent.Agent`` on the NVML source with `kernelfleet agent`'s
    defaults, its store, and /healthz and POST /api/hook over the standard library's HTTP server."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kernelfleet.catalog import Catalog
    from kernelfleet.errors import KernelfleetError
    from kernelfleet.fleet.agent import Agent, attribute_live, attribute_recorded
    from kernelfleet.fleet.store import Store
    from kernelfleet.telemetry.nvml import NvmlSource
    from kernelfleet.telemetry.replay import ReplaySource
    from kernelfleet.telemetry.sample import ProcessSample

    if replay is not None:
        source: Any = ReplaySource(replay, speed=1.0, loop=True, rebase_time=True)
        everyone = attribute_recorded(ProcessSample(pid=1, name="dry-run"))
        identify: Callable[[ProcessSample], Any] = lambda process: everyone  # one job holds the GPU
    else:
        source, identify = NvmlSource(interval_seconds=1.0), attribute_live
    store = Store(store_path)
    with source:
        agent = Agent(source, store, Catalog.load(), identify=identify)

        class Handler(BaseHTTPRequestHandler):
            def reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self.reply(200, {"ok": True, "windows": agent.windows, "backend": "stdlib"})
                else:
                    self.reply(404, {"detail": "not found"})

            def do_POST(self) -> None:
                if self.path != "/api/hook":
                    return self.reply(404, {"detail": "not found"})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    self.reply(200, agent.hook(body))
                except (KeyError, TypeError, ValueError, KernelfleetError) as exc:
                    self.reply(422, {"detail": str(exc)})

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            agent.run(threading.Event())
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            store.close()


# --- the job ----------------------------------------------------------------------------------------


class Timeline:
    """Step end times: CUDA events read back against an anchor (GPU), the host's clock (dry run)."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.torch, self.cuda = torch, cuda
        self.events: list[Any] = []
        self.walls: list[float] = []

    def begin(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.anchor = self.torch.cuda.Event(enable_timing=True)
            self.anchor.record()
            self.anchor.synchronize()
        self.start_wall = time.time()

    def mark(self) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        else:
            self.walls.append(time.time())

    def wall(self, i: int) -> float:
        return self.start_wall + self.anchor.elapsed_time(self.events[i]) / 1000.0 if self.cuda else self.walls[i]

    def ends(self) -> list[float]:
        return [self.wall(i) for i in range(len(self.events) if self.cuda else len(self.walls))]

    def recent_rate(self, seconds: float = 1.0) -> float | None:
        """Steps per second over the steps that ended in the last ``seconds`` (all complete: the Tracker
        reports right after a counted step, which synchronises)."""
        count = len(self.events) if self.cuda else len(self.walls)
        if count < 3:
            return None
        last = self.wall(count - 1)
        i = count - 2
        while i > 0 and last - self.wall(i) < seconds:
            i -= 1
        return (count - 1 - i) / (last - self.wall(i))


class ProfileRecorder:
    """The Tracker's profiler (``hook.cuda_kernels``), with the step's matmul calls and kernels kept."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    @contextmanager
    def __call__(self) -> Iterator[Any]:
        from kernelfleet.flops import FlopCount
        from kernelfleet.hook import cuda_kernels

        counter = FlopCount(ordered=True)
        with cuda_kernels() as trace:
            with counter:
                yield trace
        self.records.append({"calls": [[op, [list(s) for s in shapes], p] for op, shapes, p in counter.calls or []],
                             "launches": [[launch.op, launch.kernel] for launch in trace.launches],
                             "problem": trace.problem})


def gemm_pairs(calls: list[list[Any]], launches: list[list[Any]]) -> list[dict[str, Any]]:
    """The profiled step's matmuls and the GEMM kernels that ran them, by the rule of
    ``hook.padding_flops`` (a kernel launched by a matmul op whose name says GEMM, in launch order)."""
    from kernelfleet.flops import MATMUL_OPS
    from kernelfleet.hook import _GEMM_WORDS, gemm_dims
    from kernelfleet.ofu.kernel_tiles import (
        cluster_from_kernel_name,
        executed_flops_of_kernel,
        tile_from_kernel_name,
    )

    gemms = [kernel for op, kernel in launches if (op or "").removeprefix("aten::") in MATMUL_OPS
             and any(word in kernel.lower() for word in _GEMM_WORDS)]
    pairs = []
    for (op, shapes, precision), kernel in zip(calls, gemms):
        batch, m, n, k = gemm_dims(op, shapes)
        tile = tile_from_kernel_name(kernel)
        pairs.append({"op": op, "shapes": shapes, "precision": precision, "kernel": kernel,
                      "tile": None if tile is None else [tile.m, tile.n, tile.k],
                      "cluster": cluster_from_kernel_name(kernel), "useful": 2 * batch * m * n * k,
                      "executed": executed_flops_of_kernel(m, n, k, kernel, batch)})
    return pairs


def post_and_keep(url: str, body: dict[str, Any], token: str | None) -> Any:
    """``hook.post_json``'s request, keeping the agent's answer."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=2) as answer:
        return json.load(answer)


def run_job(out: Path, url: str, phase_seconds: float, dry_run: bool) -> dict[str, Any]:
    import torch

    from kernelfleet.catalog import Catalog
    from kernelfleet.flops import FlopCount
    from kernelfleet.hook import Tracker, cuda_kernels

    cuda = not dry_run
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run on a CPU")
    device, shape = ("cuda", GPU_SHAPE) if cuda else ("cpu", DRY_SHAPE)
    sku = Catalog.load().lookup(torch.cuda.get_device_name(0) if cuda else "NVIDIA H200", None)
    if sku is None or not sku.peak_flops("bf16"):
        raise SystemExit("this GPU is not in the catalog: no bf16 peak to measure MFU against")
    peak = sku.peak_flops("bf16")
    torch.manual_seed(0)
    width, hidden = shape["width"], shape["hidden"]
    layers = []
    for _ in range(shape["blocks"]):
        layers += [torch.nn.Linear(width, hidden, bias=False), torch.nn.GELU(), torch.nn.Linear(hidden, width, bias=False)]
    model = torch.nn.Sequential(*layers).to(device, torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(shape["tokens"], width, device=device, dtype=torch.bfloat16)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        optimizer.step()

    for _ in range(10):
        train_step()
    if cuda:
        with cuda_kernels():  # CUPTI starts once here, not inside a phase
            train_step()
        torch.cuda.synchronize()
    useful = useful_flops_per_step(**shape)
    with FlopCount() as count:
        train_step()
    run: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)", "torch": torch.__version__,
        "dry_run": dry_run, "job_label": os.environ.get("KERNELFLEET_JOB"), "pid": os.getpid(), "shape": shape,
        "precision": "bf16", "peak_flops": peak, "useful_flops_per_step": useful,
        "hooked_flops_per_step": dict(count.flops), "every": EVERY, "report_seconds": REPORT_SECONDS, "phases": [],
    }
    reports = out / "hook-reports.jsonl"
    reports.unlink(missing_ok=True)
    timelines = []
    for name, factor in PHASES:
        timeline = Timeline(cuda)
        recorder = ProfileRecorder()

        def reported(factor: float = factor, timeline: Timeline = timeline) -> float | None:
            rate = timeline.recent_rate()
            return None if rate is None else min(2.0, factor * useful * rate / peak)

        def send(url: str, body: dict[str, Any], token: str | None, name: str = name) -> None:
            sent = time.time()
            try:
                answer = post_and_keep(url, body, token)
            except OSError as exc:
                answer = {"error": repr(exc)[:300]}
            with reports.open("a") as f:
                f.write(json.dumps({"phase": name, "sent_wall": sent, "answered_wall": time.time(),
                                    "body": body, "answer": answer}) + "\n")

        tracker = Tracker(agent_url=url, every=EVERY, report_seconds=REPORT_SECONDS, reported_mfu=reported, send=send,
                          profile_every=10**9, profile=recorder if cuda else None)
        timeline.begin()
        deadline = time.monotonic() + phase_seconds
        while time.monotonic() < deadline:
            with tracker.step():
                train_step()
            timeline.mark()
        if cuda:
            torch.cuda.synchronize()  # the last report's MFU reads the last steps' events
        tracker.flush()
        ends = timeline.ends()
        profiled = recorder.records[0] if recorder.records else {"calls": [], "launches": [], "problem": None}
        correction = tracker.correction
        phase = {
            "name": name, "reported_factor": factor, "steps": len(ends), "start_wall": timeline.start_wall,
            "end_wall": ends[-1], "profiled_step": EVERY - 1 if cuda else None,
            "steady_from_wall": (ends[EVERY - 1] if cuda else timeline.start_wall) + STEADY_AFTER_SECONDS,
            "event_mfu_ratio": useful * (len(ends) - 1) / (ends[-1] - ends[0]) / peak,
            "profiled": {**profiled, "gemm_pairs": gemm_pairs(profiled["calls"], profiled["launches"]),
                         "tracker_useful_flops": correction[0] if correction else None,
                         "tracker_executed_flops": correction[1] if correction else None,
                         "tracker_note": tracker.correction_note},
        }
        run["phases"].append(phase)
        timelines.append({"name": name, "precision": "bf16", "start_wall": timeline.start_wall, "ends_wall": ends,
                          "work_per_iteration": useful, "steady_from_wall": phase["steady_from_wall"]})
        print(f"phase {name}: {len(ends)} steps, event-timed MFU {phase['event_mfu_ratio']:.3f}, "
              f"correction {correction is not None} ({tracker.correction_note})", flush=True)
        time.sleep(1.5)  # the agent's next window ends inside neither phase
    with gzip.open(out / "hook-timeline.json.gz", "wt") as f:
        json.dump({"phases": timelines}, f)
    return run


# --- what the agent stored, and the summary -------------------------------------------------------


def export_store(out: Path) -> None:
    """The agent's windows and events, as JSON, from its SQLite store (read-only, after it stopped)."""
    db = sqlite3.connect(f"file:{out / 'agent.db'}?mode=ro", uri=True)
    columns = ("uuid", "name", "sku", "ts", "window_seconds", "ofu", "tensor_active", "sm_clock_hertz", "sm_active",
               "power_watts", "stale")
    rows = db.execute(f"SELECT {', '.join(('g.' if c in columns[:3] else 's.') + c for c in columns)} "
                      "FROM samples s JOIN gpus g USING (gpu_id) ORDER BY s.ts")
    with (out / "agent-windows.jsonl").open("w") as f:
        f.writelines(json.dumps(dict(zip(columns, row))) + "\n" for row in rows)
    events = [dict(zip(("ts", "kind", "job", "detail"), row))
              for row in db.execute("SELECT ts, kind, job, detail FROM events ORDER BY ts")]
    jobs = [dict(zip(("job", "kind", "ts", "share"), row))
            for row in db.execute("SELECT j.name, j.kind, s.ts, h.share FROM holds h JOIN jobs j USING (job_id) "
                                  "JOIN samples s ON s.gpu_id = h.gpu_id AND s.ts BETWEEN h.since AND h.until "
                                  "ORDER BY s.ts")]  # a window of each hold: what schema 1 kept as job_windows
    (out / "agent-events.json").write_text(json.dumps({"events": events, "job_windows": jobs}, indent=1))
    db.close()


def summarize(out: Path, run: dict[str, Any]) -> dict[str, Any]:
    """Per phase: the agent's flags, its corrected OFU against the reported MFU, and every steady window's
    corrected OFU against the event-timed MFU over the same window.

    The agent's answers are what it said during the run, with the catalog it had; the windows' OFU is
    recomputed from their counters with today's catalog (its f_ref for bf16)."""
    from kernelfleet.catalog import Catalog
    from kernelfleet.telemetry.sample import Sample
    from kernelfleet.validation.mfu import point_windows

    reports = [json.loads(line) for line in (out / "hook-reports.jsonl").read_text().splitlines()]
    events = json.loads((out / "agent-events.json").read_text())["events"]
    windows = [json.loads(line) for line in (out / "agent-windows.jsonl").read_text().splitlines()]
    with gzip.open(out / "hook-timeline.json.gz", "rt") as f:
        timelines = {t["name"]: t for t in json.load(f)["phases"]}
    samples = [Sample(timestamp_seconds=w["ts"], window_seconds=w["window_seconds"], gpu_index=0, uuid=w["uuid"],
                      name=w["name"], tensor_active_ratio=w["tensor_active"], sm_clock_mean_hertz=w["sm_clock_hertz"])
               for w in windows if not w["stale"]]
    sku = Catalog.load().lookup(samples[0].name, None) if samples else None
    summary: dict[str, Any] = {"phases": {}}
    for phase in run["phases"]:
        name, profiled = phase["name"], phase["profiled"]
        mine = [r for r in reports if r["phase"] == name]
        flagged = [any(e["kind"] == "mfu-mismatch" and r["sent_wall"] <= e["ts"] <= r["answered_wall"] for e in events)
                   for r in mine]
        answers = [r["answer"] for r in mine]
        useful, executed = profiled["tracker_useful_flops"], profiled["tracker_executed_flops"]
        scale = useful["bf16"] / executed["bf16"] if useful and executed else None
        timeline = timelines[name]
        steady = [(mfu, raw) for s, mfu, raw in (point_windows(timeline, samples, sku) if sku else [])
                  if s.timestamp_seconds - s.window_seconds >= timeline["steady_from_wall"]]
        row: dict[str, Any] = {
            "reports": len(mine), "flagged": sum(flagged), "flags": flagged,
            "reported_mfu": [r["body"]["reported_mfu"] for r in mine],
            "agent_corrected_ofu": [a.get("corrected_ofu_ratio") for a in answers],
            "agent_notes": sorted({str(a.get("correction_note")) for a in answers}),
            "event_mfu_ratio": phase["event_mfu_ratio"], "executed_over_useful": None if scale is None else 1 / scale,
            "gemms_paired": len(profiled["gemm_pairs"]), "matmul_calls": len(profiled["calls"]),
            "tracker_note": profiled["tracker_note"], "steady_windows": len(steady),
        }
        if steady and scale is not None:
            row["window_mfu_ratio"] = statistics.mean(m for m, _ in steady)
            row["window_raw_ofu_ratio"] = statistics.mean(r for _, r in steady)
            row["window_corrected_ofu_ratio"] = row["window_raw_ofu_ratio"] * scale
            row["corrected_minus_mfu_pp"] = 100 * (row["window_corrected_ofu_ratio"] - row["window_mfu_ratio"])
            row["raw_minus_mfu_pp"] = 100 * (row["window_raw_ofu_ratio"] - row["window_mfu_ratio"])
            row["max_window_corrected_error_pp"] = max(100 * abs(r * scale - m) for m, r in steady)
        summary["phases"][name] = row
    a, b = summary["phases"].get("honest", {}), summary["phases"].get("doubled", {})
    summary["flag_ok"] = bool(a.get("reports") and b.get("reports") and not a["flagged"] and all(b["flags"]))
    return summary


def print_summary(summary: dict[str, Any], run: dict[str, Any], agent_path: str) -> None:
    f = lambda x, spec=".3f": "—" if x is None else format(x, spec)
    print(f"\nagent: {agent_path}; job label {run['job_label']!r}; useful FLOPs/step {run['useful_flops_per_step']:.4g} "
          f"(hook counted {run['hooked_flops_per_step']})")
    print("| phase | reports | flagged | corrected OFU (agent's answers, mean) | reported MFU (mean) | steady windows | "
          "event-timed MFU | corrected OFU (this catalog) | corrected − MFU (pp) | raw − MFU (pp) | executed/useful | "
          "GEMMs paired |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in summary["phases"].items():
        corrected = [x for x in row["agent_corrected_ofu"] if x is not None]
        reported = [x for x in row["reported_mfu"] if x is not None]
        print(f"| {name} | {row['reports']} | {row['flagged']} | {f(statistics.mean(corrected) if corrected else None)} | "
              f"{f(statistics.mean(reported) if reported else None)} | {row['steady_windows']} | "
              f"{f(row.get('window_mfu_ratio'))} | {f(row.get('window_corrected_ofu_ratio'))} | "
              f"{f(row.get('corrected_minus_mfu_pp'), '+.2f')} | {f(row.get('raw_minus_mfu_pp'), '+.2f')} | "
              f"{f(row['executed_over_useful'], '.4f')} | {row['gemms_paired']}/{row['matmul_calls']} |")
        if row["tracker_note"] or row["agent_notes"] != ["None"]:
            print(f"  notes: tracker {row['tracker_note']!r}; agent {row['agent_notes']}")
    verdict = "flagged (b) and not (a)" if summary["flag_ok"] else "did NOT flag as expected"
    print(f"mfu-mismatch: {verdict}" + ("  [dry run: the numbers are no measurement]" if run["dry_run"] else ""))


def run(out: Path, phase_seconds: float, port: int, dry_run: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: stop the agent on the way out
    agent, agent_path = start_agent(out, port, dry_run)
    try:
        job = run_job(out, f"http://127.0.0.1:{port}", phase_seconds, dry_run)
    finally:
        stop_agent(agent)
    job["agent_path"] = agent_path
    (out / "hook-run.json").write_text(json.dumps(job, indent=1))
    export_store(out)
    summary = summarize(out, job)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))  # as the run saw it; `summary` only prints
    print_summary(summary, job, agent_path)


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="start the agent, train in two phases, record and summarise")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase-seconds", type=float, default=22.0)
    p.add_argument("--port", type=int, default=9400, help="the agent's port (the Tracker's default is 9400)")
    p.add_argument("--dry-run", action="store_true", help="CPU: a tiny model, the agent on a replayed recording")
    p = sub.add_parser("summary", help="anywhere: the table again, from the files `run` wrote")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("serve-agent", help="(run by `run`) the agent behind a stdlib HTTP endpoint")
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--replay", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        print(f"command: {command_line()}", flush=True)
        run(args.out, args.phase_seconds, args.port, args.dry_run)
    elif args.command == "summary":
        job = json.loads((args.out / "hook-run.json").read_text())
        print_summary(summarize(args.out, job), job, job["agent_path"])
    else:
        serve_agent(args.store, args.port, args.replay)


if __name__ == "__main__":
    main()
