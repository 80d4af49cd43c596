"""Throughput-MILP solve time and optimality gap on synthetic transformer-like graphs.

Sizes 50..1,000 kernels x 2, 3, 4 devices (kernelfleet.plan.synthetic.layered: 10 launches per
layer plus embedding/final norm/head), solved cold (no start) without compression, with
compression (one block placed alike in every layer), with ``groups = devices`` (the
repeats split into that many runs, each placed alike), and staged (policy.throughput: the
full MILP started from the best of the baselines and a quick grouped solve; baselines'
time not counted in "solve s" there). Beside them: the paper's Gurobi
times (Tessera, PAPERS.md B: 1,000 kernels x 2 GPUs 0.43 s, x 3 3.1 s, x 4 113 s) and our
targets (<= 0.5 s for 1,000 x 2, <= 10 s for 1,000 x 4, with compression).

"gap" is (objective - best valid lower bound) / objective, where the bound is the larger of
the zero-communication LP and the uncompressed MILP's dual bound; compressed solves'
own gaps are within their restricted problem, so they are not used as bounds.
"best base" is the best kernel-placement baseline (single device, pipeline, attention/FFN,
latency-greedy) and "replicas" request distribution, both under the same cost model.

    python -m bench.plan_solver [--time-limit 8] [--sizes 5,20,50,100] [--devices 2,3,4]
"""

from __future__ import annotations

import sys
import time

from bench import Parser, command_line
from kernelfleet.errors import UsageError
from kernelfleet.plan.baselines import baselines
from kernelfleet.plan.milp import solve_throughput
from kernelfleet.plan.policy import throughput
from kernelfleet.plan.synthetic import layered

GUROBI_SECONDS = {(1000, 2): 0.43, (1000, 3): 3.1, (1000, 4): 113.0}  # Tessera, arXiv 2604.10180


def main() -> None:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=8.0, help="seconds per solve")
    parser.add_argument("--sizes", default="5,20,50,100", help="layers (10 kernels each, plus 3)")
    parser.add_argument("--devices", default="2,3,4")
    args = parser.parse_args()
    print(f"$ {command_line()}")
    head = (f"{'kernels':>7} {'dev':>3} | {'variant':<10} {'solve s':>8} {'objective ms':>12} {'gap':>7} "
            f"{'status':<18} | {'LP bound':>8} {'0-comm LP':>9} {'best base':>9} {'replicas':>8} | Gurobi s")
    print(head)
    print("-" * len(head))
    began = time.perf_counter()
    for layers in (int(s) for s in args.sizes.split(",")):
        for devices in (int(d) for d in args.devices.split(",")):
            problem = layered(layers, devices)
            n = len(problem.program.launches)
            plans, _ = baselines(problem)
            base = min(p.details.throughput_seconds for p in plans if p.policy != "replicas")
            reps = next(p.details.throughput_seconds for p in plans if p.policy == "replicas")
            runs = [("full", lambda: solve_throughput(problem, time_limit_seconds=args.time_limit)),
                    ("compress", lambda: solve_throughput(problem, time_limit_seconds=args.time_limit, compress=True)),
                    (f"groups={devices}", lambda: solve_throughput(problem, time_limit_seconds=args.time_limit,
                                                                   compress=True, groups=devices)),
                    # what `policy.throughput` does: baselines and a quick grouped solve, then the
                    # full MILP from the best of them, all within the same time limit
                    ("staged", lambda: throughput(problem, time_limit_seconds=args.time_limit)[0])]
            solved = []
            for variant, solve in runs:
                try:
                    solved.append((variant, solve()))
                except UsageError as exc:  # no feasible placement found within the limit
                    solved.append((variant, str(exc)))
            bounds = [plan.details.zero_comm_lp_seconds for _, plan in solved if not isinstance(plan, str)]
            full = solved[0][1]
            if not isinstance(full, str):
                bounds.append(full.details.mip_dual_bound_seconds)
            bound = max(bounds)
            gurobi = GUROBI_SECONDS.get((round(n, -2), devices))
            for variant, plan in solved:
                if isinstance(plan, str):
                    print(f"{n:>7} {devices:>3} | {variant:<10} {'—':>8} {'no plan':>12} {'':>7} {plan[:40]}")
                    continue
                d = plan.details
                gap = (plan.objective_seconds - bound) / plan.objective_seconds
                lp = d.lp_relaxation_seconds
                print(f"{n:>7} {devices:>3} | {variant:<10} {d.solve_seconds:>8.2f} "
                      f"{plan.objective_seconds * 1e3:>12.4f} {gap:>7.2%} {d.status[:18]:<18} | "
                      f"{(lp or float('nan')) * 1e3:>8.4f} {d.zero_comm_lp_seconds * 1e3:>9.4f} "
                      f"{base * 1e3:>9.4f} {reps * 1e3:>8.4f} | {gurobi if gurobi and variant == 'full' else ''}")
            sys.stdout.flush()
    print(f"total {time.perf_counter() - began:.0f} s; bounds and objectives in ms per request")


if __name__ == "__main__":
    main()
