"""Planner scaling on a captured graph: the 8B Llama decode step on 2 to 16 devices (CPU only).

    python -m bench.plan_scaling_captured [--devices 2,4,8,16] [--time-limit 60]

Devices are copies of the two measured H200 profiles (tests/data/h200-capture): half of them the
"compute" profile, half the "bandwidth" one, every pair joined by a 25 GB/s link. For each size:
the staged throughput policy (best baseline and a quick grouped solve start the full MILP) over
all devices, replicas of the pair placement (each compute/bandwidth pair serves whole requests
with its own 2-device plan, ``policy.group_replicas``), the zero-communication bound and request
distribution (replicas) under the same cost model.
"""

from __future__ import annotations

import json
import time
from itertools import combinations
from pathlib import Path

from bench import Parser, command_line
from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.milp import zero_comm_bound
from kernelfleet.plan.model import Device, Link, Problem
from kernelfleet.plan.policy import group_replicas, throughput
from kernelfleet.profile.table import cost_table

DATA = Path(__file__).parents[1] / "tests" / "data" / "h200-capture"


def problem(devices: int, gbps: float) -> Problem:
    raw = RawCapture.load(DATA / "llama8b-decode.capture.json.gz")
    program = assemble(raw)
    profile = json.loads((DATA / "llama8b-decode.profile.json").read_text())
    measured = cost_table(raw, program, {n: p["seconds"] for n, p in profile["profiles"].items() if n != "whole"},
                          "measured")
    names = [f"{'compute' if i % 2 == 0 else 'bandwidth'}{i // 2}" for i in range(devices)]
    rows = [{n: row["compute" if n.startswith("compute") else "bandwidth"] for n in names} for row in measured.seconds]
    costs = CostTable(rows, f"{devices} copies of the measured H200 profiles", measured.flops, measured.bytes,
                      measured.precision)
    links = [Link(a, b, gbps * 1e9) for a, b in combinations(names, 2)]
    return Problem(program, [Device(n) for n in names], links, costs)


def main() -> None:
    parser = Parser()
    parser.add_argument("--devices", default="2,4,8,16")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--link-gbps", type=float, default=25.0)
    args = parser.parse_args()
    print(f"command: {command_line()}", flush=True)
    print(f"{'devices':>7} {'solve s':>8} {'MILP ms':>8} {'pairs ms':>9} {'0-comm':>8} {'replicas':>9} "
          f"{'MILP/replicas':>13} {'pairs/replicas':>14} started from")
    for n in (int(x) for x in args.devices.split(",")):
        p = problem(n, args.link_gbps)
        began = time.perf_counter()
        plan, plans, _ = throughput(p, time_limit_seconds=args.time_limit)
        solve = time.perf_counter() - began
        replicas = next(x for x in plans if x.policy == "replicas").details.throughput_seconds
        bound = zero_comm_bound(p)["lp"]
        milp = plan.details.throughput_seconds
        pairs = group_replicas(p, [[f"compute{i}", f"bandwidth{i}"] for i in range(n // 2)],
                               time_limit_seconds=args.time_limit).details.throughput_seconds
        print(f"{n:>7} {solve:>8.1f} {milp * 1e3:>8.2f} {pairs * 1e3:>9.2f} {bound * 1e3:>8.2f} {replicas * 1e3:>9.2f} "
              f"{replicas / milp:>12.2f}x {replicas / pairs:>13.2f}x {plan.details.started_from}", flush=True)


if __name__ == "__main__":
    main()
