"""The 0.908 clock question (issue 4; docs/validation/ofu.md, "The residual"), on one GPU.

On the GMMA paths the sweep's loops did full-rate math on GPM's busy fraction at 0.908 × the SM
clock NVML reported (DMMA: 0.998). Either SM cycles elapse ~9 % slower than NVML reports during
GMMA work, or GPM counts ~9 % more busy cycles than the math needs. Two measurements tell them apart:

    python -m bench.ofu_clock_check loop --out DIR   # ~45 s
    python -m bench.ofu_clock_check ncu --out DIR    # ~60 s, ncu on PATH
    python -m bench.ofu_clock_check duty --out DIR   # ~25 s
    kernelfleet bench ofu-report tests/data/h200-sweep --clock DIR   # anywhere: tables and verdict

``loop``: for a handful of the sweep's points (``kernelfleet.bench.ofu_sweep``: bf16 large, short-K,
small and huge, fp16, fp8, tf32 on its GMMA and its CUTLASS 2.x kernel, fp64), a steady loop of
CUDA-graph replays timed with CUDA events (executed FLOP/s) while ``kernelfleet record`` samples GPM
in 0.5-s windows, another process reads NVML's SM clock and clock-event reasons every millisecond,
and a one-warp probe kernel on a stream of its own reads its SM's cycle counter (``%clock64``) against
the GPU's nanosecond timer (``%globaltimer``) every 2 ms. Probe cycles / NVML's clock at 0.908 and GPM
busy = the math's need means the first explanation; at 1 with GPM 10 % over the need, the second.
The probe also runs alone (no GEMM), at the start and the end, to show it counts NVML's cycles there.

``ncu``: one launch of each of those GEMMs after another under ``ncu --clock-control none`` (clocks
are never locked), each bracketed by host timestamps while the NVML reader runs: ncu's elapsed SM
cycles, the rate it counted them at and the kernel's duration, beside NVML's clock inside the
bracket; and, with the loop, the cycles a kernel takes over its time in the loop.

``duty``: the loop's bf16 8192³ GEMM with 0, 1, 3 and 9 launches of an in-place add after each
GEMM, each add about a third of a GEMM's time (memory work, no tensor-core math): the tensor pipes
busy 100 … 25 % of the time, as between a job's GEMMs. Whether the probe's cycle rate then moves
with GPM's tensor activity is what decides if the 0.903 applies to a job's busy time only.

Writes into DIR: clock-loop.jsonl.gz (one line per point: the sweep's point fields, kernels,
timeline, probe samples), clock-trace.jsonl.gz (counter windows), nvml-clock-loop.jsonl.gz and
nvml-clock-ncu.jsonl.gz (``[wall seconds, SM MHz, clock-event reasons or null]`` per read),
ncu-clock.csv, ncu-clock.err, ncu-clock-launches.jsonl, clock-meta.json.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import Parser, command_line

# (precision, M, N, K): the sweep's points whose loops answer the question. bf16 8192^3 and
# 16384^3 sit under the power cap, 1024^3 runs short kernels at a high clock, 8192x8192x1024 is the
# short-K shape with the lowest ratio; tf32 512^3 runs the CUTLASS 2.x sm80 kernel; fp64 is DMMA.
CLOCK_POINTS = (
    ("bf16", 8192, 8192, 8192), ("bf16", 8192, 8192, 1024), ("bf16", 1024, 1024, 1024),
    ("bf16", 16384, 16384, 16384), ("fp16", 8192, 8192, 8192), ("fp8", 8192, 8192, 8192),
    ("tf32", 8192, 8192, 8192), ("tf32", 512, 512, 512), ("fp64", 8192, 8192, 8192),
)
DUTY_POINT = ("bf16", 8192, 8192, 8192)
DUTY_FILLERS = (0, 1, 3, 9)  # adds after each GEMM, each about a third of its time
PROBE_PERIOD_SECONDS = 0.002
WARM_SECONDS = 0.6  # GEMMs before the timed run, so the clock has settled under the load
LAUNCHES_UNDER_NCU = 3
NCU_FILTER = "regex:Kernel2|nvjet|gemm|cutlass"  # as bench/ncu_sweep.sh: ncu matches the base name


def chosen_points() -> list[tuple[int, int, int, str]]:
    """CLOCK_POINTS as the sweep defines them (``ofu_sweep.points()``), in its order."""
    from kernelfleet.bench.ofu_sweep import points

    wanted = set(CLOCK_POINTS)
    chosen = [p for p in points() if (p[3], p[0], p[1], p[2]) in wanted]
    if len(chosen) != len(CLOCK_POINTS):
        raise SystemExit(f"only {len(chosen)} of {len(CLOCK_POINTS)} clock points are sweep points")
    return chosen


def chosen_point(point: tuple[str, int, int, int]) -> tuple[int, int, int, str]:
    """One (precision, M, N, K) as the sweep defines it: (M, N, K, precision)."""
    return next(p for p in chosen_points() if (p[3], p[0], p[1], p[2]) == point)


# --- the NVML reader: its own process, so that no GIL and no profiler stalls it -----------------


def poll(out: Path, seconds: float, period: float) -> None:
    """Read GPU 0's SM clock every ``period`` (clock-event reasons every tenth read) until stopped."""
    from kernelfleet.telemetry.nvml_api import Nvml

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    nvml = Nvml()
    nvml.init()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    reasons = next((f for f in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
                    if hasattr(nvml.m, f)), None)
    end = time.monotonic() + seconds
    tick = time.monotonic()
    with gzip.open(out, "wt") as f:
        i = 0
        while not stop and time.monotonic() < end:
            wall = time.time()
            mhz = nvml.call("nvmlDeviceGetClockInfo", handle, nvml.m.NVML_CLOCK_SM)
            why = nvml.optional(reasons, handle) if reasons and i % 10 == 0 else None
            f.write(json.dumps([round(wall, 6), mhz, why]) + "\n")
            i += 1
            tick = max(tick + period, time.monotonic() - period)  # fallen behind: do not burst to catch up
            time.sleep(max(0.0, tick - time.monotonic()))
    nvml.shutdown()


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def start_poller(out: Path, seconds: float) -> subprocess.Popen:
    return start([sys.executable, "-m", "bench.ofu_clock_check", "poll", "--out", str(out), "--seconds", str(seconds)],
                 out.with_suffix(".log"))


# --- the cycle probe ----------------------------------------------------------------------------


@functools.cache
def _probe_kernel() -> Any:
    # Triton resolves names in a kernel through the module's globals, so `tl` is bound there.
    global tl
    import triton
    import triton.language as tl

    # Not specialised on its integers: a recompile at launch would start it a second after launch_wall.
    @triton.jit(do_not_specialize=["samples", "period_ns"])
    def probe(out_ptr, samples, period_ns):
        # Sample i waits for start + i * period on the timer, then reads the cycle counter between
        # two timer reads: [timer, clock64, bracket ns] per sample, the SM's id after the last.
        start = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        for i in range(samples):
            target = start + i.to(tl.int64) * period_ns
            now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
            while now < target:
                now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                                pack=1)
            count = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
            after = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                              pack=1)
            tl.store(out_ptr + 3 * i, now)
            tl.store(out_ptr + 3 * i + 1, count)
            tl.store(out_ptr + 3 * i + 2, after - now)
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
        tl.store(out_ptr + 3 * samples, sm.to(tl.int64))

    return probe


class Probe:
    """One warp on one SM, on a stream of its own beside the GEMMs, counting that SM's cycles."""

    def __init__(self, period: float = PROBE_PERIOD_SECONDS) -> None:
        import torch

        self.torch = torch
        self.period = period
        self.stream = torch.cuda.Stream()
        self.read(self.launch(0.02))  # compile it now, not inside a timed loop

    def launch(self, seconds: float) -> tuple[Any, tuple[float, float], Any, int]:
        torch = self.torch
        samples = 16 * max(1, math.ceil(seconds / self.period / 16))
        buf = torch.zeros(3 * samples + 1, dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()  # an idle GPU: the probe takes its SM at once, before any GEMM
        done = torch.cuda.Event()
        wall = time.time()
        with torch.cuda.stream(self.stream):
            _probe_kernel()[(1,)](buf, samples, int(self.period * 1e9), num_warps=1)
            done.record()
        # The kernel starts between the two; a gap of more than microseconds means Triton compiled.
        return buf, (wall, time.time()), done, samples

    def read(self, run: tuple[Any, tuple[float, float], Any, int]) -> dict[str, Any]:
        buf, (wall, returned), done, samples = run
        done.synchronize()
        values = buf.cpu().tolist()
        return {"launch_wall": wall, "launch_returned_wall": returned, "period_seconds": self.period,
                "smid": values[-1], "samples": [values[3 * i:3 * i + 3] for i in range(samples)]}


def idle_probe(probe: Probe, seconds: float = 1.0) -> dict[str, Any]:
    run = probe.launch(seconds)
    result = probe.read(run)
    # The first 0.3 s leave the clock time to rise from idle; NVML's reads are compared inside.
    return {"idle": True, "start_wall": run[1][0] + 0.3, "end_wall": run[1][0] + seconds - 0.05, "probe": result}


# --- the GEMM loops -----------------------------------------------------------------------------


def third_of_a_gemm(m: int, n: int, k: int, precision: str) -> Any:
    """An in-place add over a float32 buffer sized to take about a third of one GEMM's time: memory
    work without tensor-core math."""
    import torch

    from kernelfleet.bench.ofu_sweep import operands

    def seconds(fn: Any) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 5e3

    gemm, trial = operands(m, n, k, precision), torch.zeros(1 << 27, device="cuda")
    size = int(trial.numel() * seconds(gemm) / 3 / seconds(lambda: trial.add_(1.0)))
    buf = torch.zeros(max(size, 1 << 20), device="cuda")
    return lambda: buf.add_(1.0)


def run_loop(m: int, n: int, k: int, precision: str, seconds: float, probe: Probe | None,
             fillers: int = 0) -> dict[str, Any]:
    """One point: ofu_sweep's GEMM in CUDA-graph replays for ``seconds`` after a warm-up, the probe
    running from before the warm-up to after the end, with ``fillers`` adds of a third of a GEMM's
    time after each GEMM. Fields as ofu_sweep.run_point writes them."""
    import torch

    from kernelfleet.bench.ofu_sweep import gemm_graph

    between = None
    if fillers:
        add = third_of_a_gemm(m, n, k, precision)

        def between() -> None:
            for _ in range(fillers):
                add()

    made = gemm_graph(m, n, k, precision, between)
    graph, stream, names, per_graph, flops = made.graph, made.stream, made.kernels, made.per_graph, made.flops
    run = probe.launch(WARM_SECONDS + seconds + 0.4) if probe is not None else None
    # No device-wide synchronize from here on: it would wait for the probe.
    with torch.cuda.stream(stream):
        events = _replay_until(graph, time.monotonic() + WARM_SECONDS)
        events[-1].synchronize()
        anchor = torch.cuda.Event(enable_timing=True)
        anchor.record()
        anchor.synchronize()
        start_wall = time.time()
        events = _replay_until(graph, time.monotonic() + seconds)
    stream.synchronize()
    ends = [start_wall + anchor.elapsed_time(e) / 1000.0 for e in events]
    point = {
        "m": m, "n": n, "k": k, "precision": precision, "kernels": names,
        "gemms_per_replay": per_graph, "work_per_iteration": flops * per_graph,
        "start_wall": start_wall, "ends_wall": ends,
        "mean_flops": flops * per_graph * len(ends) / (ends[-1] - start_wall), "filler_launches": fillers,
    }
    if run is not None:
        point["probe"] = probe.read(run)
    del graph
    return point


def _replay_until(graph: Any, deadline: float) -> list[Any]:
    import torch

    events = []
    while time.monotonic() < deadline or not events:
        graph.replay()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events.append(event)
        if len(events) % 32 == 0:
            events[-16].synchronize()  # keep the queue short, so the timeline is the GPU's
    return events


def loop(out: Path, seconds: float, runs: list[tuple[int, int, int, str, int]], what: str) -> None:
    """``runs``: (M, N, K, precision, fillers) each; ``what`` names the subcommand in the trace."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    budget = 20.0 + len(runs) * (seconds + 4.0)
    poller = start_poller(out / "nvml-clock-loop.jsonl.gz", budget)
    recorder = start([sys.executable, "-m", "kernelfleet", "record", "-o", str(out / "clock-trace.jsonl.gz"),
                      "--interval", "0.5", "--clock-poll", "0.002", "--dense-clock", "--duration", str(budget),
                      "--note", f"clock check (bench/ofu_clock_check.py {what})"], out / "clock-trace.log")
    lines = out / "clock-loop.jsonl.gz"
    lines.unlink(missing_ok=True)
    meta: dict[str, Any] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                            "seconds": seconds, "points": [list(r) for r in runs]}
    try:
        time.sleep(2.0)
        try:
            probe: Probe | None = Probe()
        except Exception as exc:
            probe, meta["probe_error"] = None, repr(exc)[:500]
            print(f"probe unavailable: {exc!r}"[:300], file=sys.stderr, flush=True)
        if probe:
            _append(lines, idle_probe(probe))
        for m, n, k, precision, fillers in runs:
            try:
                result = run_loop(m, n, k, precision, seconds, probe, fillers)
                print(f"{precision:5} {m}x{n}x{k} + {fillers} adds: {result['mean_flops'] / 1e12:.1f} TFLOP/s "
                      f"{[x for x in result['kernels'] if 'Memset' not in x][:1]}", file=sys.stderr, flush=True)
            except Exception as exc:
                result = {"m": m, "n": n, "k": k, "precision": precision, "filler_launches": fillers,
                          "error": repr(exc)[:300]}
                print(f"{precision} {m}x{n}x{k} failed: {exc!r}"[:300], file=sys.stderr, flush=True)
            _append(lines, result)
            torch.cuda.empty_cache()
            time.sleep(0.3)
        if probe:
            _append(lines, idle_probe(probe))
        time.sleep(1.0)
    finally:
        stop(recorder, signal.SIGINT)  # `record` closes its trace cleanly on Ctrl-C
        stop(poller)
        (out / "clock-meta.json").write_text(json.dumps(meta, indent=1))


def _append(path: Path, record: dict[str, Any]) -> None:
    with gzip.open(path, "at") as f:
        f.write(json.dumps(record) + "\n")


# --- under Nsight Compute -----------------------------------------------------------------------


def ncu(out: Path, timeout: float) -> int:
    from kernelfleet.validation.clock_check import CLOCK_METRICS

    out.mkdir(parents=True, exist_ok=True)
    poller = start_poller(out / "nvml-clock-ncu.jsonl.gz", timeout + 10)
    cmd = ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", "clock/", "-k", NCU_FILTER,
           "--metrics", ",".join(CLOCK_METRICS), "--csv", sys.executable, "-m", "bench.ofu_clock_check", "ncu-child",
           "--out", str(out)]
    time.sleep(1.0)
    try:
        with (out / "ncu-clock.csv").open("w") as csv_out, (out / "ncu-clock.err").open("w") as err:
            child = subprocess.Popen(cmd, stdout=csv_out, stderr=err, start_new_session=True)
            try:
                return child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)  # ncu and the program it profiles
                child.wait()
                return 124
    finally:
        stop(poller)


def ncu_child(out: Path) -> None:
    """Runs under ncu: every chosen GEMM warmed up outside the NVTX range "clock", then launched
    LAUNCHES_UNDER_NCU times inside it, each launch between two host timestamps. Prints nothing on
    stdout: ncu writes its CSV there."""
    import torch

    from kernelfleet.bench.ofu_sweep import operands

    steps = []
    for m, n, k, precision in chosen_points():
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        step = operands(m, n, k, precision)
        step()
        steps.append(((m, n, k, precision), step))
    torch.cuda.synchronize()
    launches = []
    torch.cuda.nvtx.range_push("clock")
    for (m, n, k, precision), step in steps:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"  # the kernel choice depends on it
        for j in range(LAUNCHES_UNDER_NCU):
            time.sleep(0.02)  # NVML reads between launches belong to none
            before = time.time()
            step()
            torch.cuda.synchronize()
            launches.append({"m": m, "n": n, "k": k, "precision": precision, "launch": j,
                             "before": before, "after": time.time()})
    torch.cuda.nvtx.range_pop()
    with (out / "ncu-clock-launches.jsonl").open("w") as f:
        f.writelines(json.dumps(launch) + "\n" for launch in launches)
    print(f"{len(launches)} launches profiled", file=sys.stderr)


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("loop", help="steady GEMM loops beside the cycle probe, GPM and 1-ms NVML reads")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per point")
    p = sub.add_parser("duty", help="bf16 8192^3 loops with memory work between the GEMMs, beside the probe")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per point")
    p = sub.add_parser("ncu", help="one launch per point under ncu, NVML read every millisecond")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=85.0, help="seconds before ncu is stopped")
    p = sub.add_parser("ncu-child", help="(run by `ncu`) the launches ncu profiles")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("poll", help="(run by the others) NVML's SM clock every --period seconds")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--period", type=float, default=0.001)
    args = parser.parse_args()
    print(f"command: {command_line()}", file=sys.stderr, flush=True)
    if args.command in ("loop", "duty", "ncu"):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: stop the helpers on the way out
    if args.command == "loop":
        loop(args.out, args.seconds, [(m, n, k, precision, 0) for m, n, k, precision in chosen_points()], "loop")
    elif args.command == "duty":
        loop(args.out, args.seconds, [(*chosen_point(DUTY_POINT), f) for f in DUTY_FILLERS], "duty")
    elif args.command == "ncu":
        rc = ncu(args.out, args.timeout)
        print(f"ncu rc={rc}", file=sys.stderr)
        sys.exit(rc)
    elif args.command == "ncu-child":
        ncu_child(args.out)
    else:
        poll(args.out, args.seconds, args.period)


if __name__ == "__main__":
    main()
