"""Record the H200 fixture traces and check OFU against MFU timed with CUDA events.

    python -m bench.record_traces --out DIR

For each workload (idle, bf16 GEMM, fp8 GEMM, copy, transformer training) a
``kernelfleet record`` process samples the GPU while this process runs the
loop; the loop's timeline (per-iteration end times from CUDA events) gives the
work done inside every recorded window. Then ``kernelfleet watch --once --json``
is run during a bf16 GEMM loop and on the idle GPU, and compared with MFU over
the exact window it reports. Writes traces, timelines and a summary to DIR.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import Parser, loops

H200_BF16_DENSE_PEAK = 989.4e12  # NVIDIA H200 datasheet, dense (sparse 1979 / 2)
KF = [sys.executable, "-m", "kernelfleet"]


def record(out: Path, name: str, seconds: float, work) -> dict:
    trace = out / f"h200-{name}.jsonl.gz"
    proc = subprocess.Popen(
        KF + ["record", "-o", str(trace), "--duration", str(seconds), "--note", f"H200 {name} loop"],
        stderr=subprocess.PIPE, text=True,
    )
    time.sleep(1.5)
    timeline = work(seconds - 3.0) if work else None
    if timeline is None:
        time.sleep(seconds - 1.5)
    _, stderr = proc.communicate(timeout=120)
    if proc.returncode:
        raise SystemExit(f"record {name} failed: {stderr}")
    result = {"trace": trace.name, "windows": []}
    if timeline is not None:
        (out / f"timeline-{name}.json.gz").write_bytes(gzip.compress(json.dumps(timeline.to_dict()).encode()))
    with gzip.open(trace, "rt") as f:
        next(f)
        for line in f:
            s = json.loads(line)["samples"][0]
            w = {k: s[k] for k in ("timestamp_seconds", "window_seconds", "tensor_active_ratio",
                                   "hmma_active_ratio", "sm_active_ratio", "dram_bandwidth_ratio",
                                   "sm_clock_mean_hertz", "sm_clock_instant_hertz", "sm_clock_polls",
                                   "power_mean_watts")}
            if timeline is not None:
                end, span = s["timestamp_seconds"], s["window_seconds"]
                work_done = timeline.work_between(end - span, end)
                w["measured_rate"] = work_done / span
                w["unit"] = timeline.unit
            result["windows"].append(w)
    return result


def watch_once(interval: float = 2.0) -> dict:
    done = subprocess.run(KF + ["watch", "--once", "--json", "--interval", str(interval)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode:
        return {"watch_failed": done.stderr.strip()}
    return json.loads(done.stdout)[0]


def validate_watch(out: Path) -> dict:
    """watch --once --json during a bf16 8192^3 loop: OFU vs MFU over the same window."""
    readings: list[dict] = []

    def sampler() -> None:
        for _ in range(3):
            time.sleep(4.0)
            readings.append(watch_once())

    thread = threading.Thread(target=sampler)
    thread.start()
    timeline = loops.gemm(20.0)
    thread.join()
    (out / "timeline-watch.json.gz").write_bytes(gzip.compress(json.dumps(timeline.to_dict()).encode()))
    checks = []
    for r in readings:
        if "watch_failed" in r:
            checks.append(r)
            continue
        end, span = r["timestamp_seconds"], r["window_seconds"]
        mfu = timeline.work_between(end - span, end) / span / H200_BF16_DENSE_PEAK
        checks.append({"watch": r, "mfu_ratio": mfu,
                       "ofu_minus_mfu_pp": None if r["ofu_ratio"] is None else 100 * (r["ofu_ratio"] - mfu)})
    idle = watch_once()
    return {"loaded": checks, "idle": idle}


def main() -> None:
    parser = Parser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--only", choices=["record", "watch"], help="Run one half only.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    summary: dict = {"started": time.time()}
    plan = [
        ("idle", None),
        ("bf16-gemm", lambda s: loops.gemm(s)),
        ("fp8-gemm", lambda s: loops.fp8_gemm(s)),
        ("copy", lambda s: loops.copy(s)),
        ("transformer", lambda s: loops.transformer(s)),
    ]
    for name, work in plan if args.only != "watch" else []:
        print(f"== recording {name}", flush=True)
        try:
            summary[name] = record(args.out, name, args.seconds, work)
        except Exception as exc:
            summary[name] = {"error": repr(exc)}
            print(f"   failed: {exc!r}", flush=True)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.only == "record":
        return
    print("== watch --once --json against MFU", flush=True)
    summary["watch_validation"] = validate_watch(args.out)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for c in summary["watch_validation"]["loaded"]:
        if "mfu_ratio" in c:
            w = c["watch"]
            print(f"watch: OFU {w['ofu_ratio']:.4f} tensor {w['tensor_active_ratio']:.4f} "
                  f"clock {w['sm_clock_mean_hertz'] / 1e6:.0f} MHz ({w['sm_clock_polls']} polls) "
                  f"window {w['window_seconds']:.3f}s | MFU {c['mfu_ratio']:.4f} | diff {c['ofu_minus_mfu_pp']:+.2f} pp")
        else:
            print("watch failed:", c)
    idle = summary["watch_validation"]["idle"]
    print("idle:", {k: idle.get(k) for k in ("ofu_ratio", "tensor_active_ratio", "sm_clock_mean_hertz", "error")})


if __name__ == "__main__":
    main()
