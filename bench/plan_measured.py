"""Plans for the H200-sized steps on costs measured on the emulated H200 pair (CPU only).

    python -m bench.plan_measured --out DIR [--steps llama8b-decode,...] [--link-gbps 25] [--time-limit 60]

Builds each step's program from its committed capture (tests/data/h200-capture) and its cost
table from the per-kernel times measured there on the "compute" (56 SMs + 64-SM hog) and
"bandwidth" (32 SMs) profiles, writes both as JSON, and plans them as ``kernelfleet plan --policy
all`` does (every baseline beside the MILP, with a Gantt chart of the throughput plan), then the
requests/s of a serving mix under each strategy, prefill/decode split included
(``plan/serving.py``). First it prints
the roofline cost model's leave-one-device-out error on the three measured profiles (compute,
bandwidth, whole H200), each described by its calibrated GEMM FLOP/s and GEMV bytes/s.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import Parser, command_line
from kernelfleet.catalog import Catalog
from kernelfleet.costs.model import leave_one_out
from kernelfleet.costs.roofline import Capability
from kernelfleet.graph.deps import kernel_kind
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan import command
from kernelfleet.plan.gantt import draw
from kernelfleet.plan.serving import Phase, rates
from kernelfleet.profile.table import cost_table, preference
from kernelfleet.workloads import preset

DATA = Path(__file__).parents[1] / "tests" / "data" / "h200-capture"
STEPS = "llama8b-decode,llama8b-prefill"  # also profiled: moe20b-decode, mamba7b-decode, vlm7b-prefill, dit-h200-denoise


def model_error(raw: RawCapture, program, profile: dict) -> None:
    """The roofline model fitted on two of the measured profiles, predicting the third."""
    h200 = Catalog.load().get("h200-sxm")
    seconds = {name: p["seconds"] for name, p in profile["profiles"].items()}
    caps = {}
    for name, p in profile["profiles"].items():
        rates, share = p["calibration"], (p.get("sms") or h200.sm_count) / h200.sm_count
        caps[name] = Capability({"bf16": rates["gemm_flops_per_second"], "fp32": h200.peak_flops("fp32") * share},
                                rates["gemv_bytes_per_second"], f"calibrated {name}")
    error = leave_one_out(cost_table(raw, program, seconds, "measured"), [kernel_kind(x) for x in program.launches],
                          caps)
    print(f"  roofline model, {error.summary()}", flush=True)


def main() -> None:
    parser = Parser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--link-gbps", type=float, default=25.0)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--output-tokens", default="64,256,1024")
    parser.add_argument("--steps", default=STEPS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"command: {command_line()}", flush=True)
    console = Console(width=160)
    phases = {}
    for step in args.steps.split(","):
        # the checked capture where there is one; a step only profiled has the capture it was timed on
        checked = DATA / f"{step}.capture.json.gz"
        raw = RawCapture.load(checked if checked.exists() else DATA / f"{step}.profiled-capture.json.gz")
        program = assemble(raw)
        profile = json.loads((DATA / f"{step}.profile.json").read_text())
        seconds = {name: p["seconds"] for name, p in profile["profiles"].items() if name != "whole"}
        costs = cost_table(raw, program, seconds, f"measured on the emulated H200 pair ({step})")
        (args.out / f"{step}.program.json").write_text(program.to_json())
        (args.out / f"{step}.costs.json").write_text(costs.to_json())
        p = preference(costs, "compute", "bandwidth")
        whole = sum(profile["profiles"]["whole"]["seconds"])
        console.print(f"{step}: compute {sum(seconds['compute']) * 1e3:.1f} ms, bandwidth "
                      f"{sum(seconds['bandwidth']) * 1e3:.1f} ms, whole H200 {whole * 1e3:.1f} ms per step; "
                      f"{p.kernels_faster_on_weaker} of {p.kernels} kernels ({p.share_of_kernels:.0%}, "
                      f"{p.share_of_time:.0%} of {p.stronger}'s time) run faster on the slower {p.weaker}")
        model_error(raw, program, profile)
        done = command.setup(args.out / f"{step}.program.json", args.out / f"{step}.costs.json", [],
                             [f"compute:bandwidth:{args.link_gbps}"], args.link_gbps, [], [], None)
        _, plans = command.make_plans(done.problem, "all", args.time_limit)
        header, rows = command.table(done.problem, plans, None)
        t = Table(*header, title=f"{step}: plans on measured costs, {args.link_gbps:g} GB/s", title_justify="left")
        for row in rows:
            t.add_row(*row)
        console.print(t)
        console.print(command.verdict(plans))
        milp = next(x for x in plans if x.policy == "throughput-milp")
        draw(done.problem, milp, args.out / f"{step}-gantt.png")
        single = {name: sum(v) for name, v in seconds.items()}
        phases[step] = (single, milp.details.throughput_seconds)
    if {"llama8b-prefill", "llama8b-decode"} <= phases.keys():
        serving_table(phases, args, console)


def serving_table(phases: dict, args: argparse.Namespace, console: Console) -> None:
    """Requests/s of a Llama-8B serving mix (prompt 2,048 tokens, batch-16 decode) per strategy."""
    cfg = preset("llama", "h200")
    prompt = 2048
    kv_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2 * prompt  # K and V, bf16
    (pre_single, pre_placed), (dec_single, dec_placed) = phases["llama8b-prefill"], phases["llama8b-decode"]
    prefill = Phase(pre_single, pre_placed, rows=1)
    decode = Phase(dec_single, dec_placed, rows=cfg.max_batch)
    t = Table("output tokens", "strategy", "requests/s", "vs replicas",
              title=f"serving Llama-8B on the emulated pair: prompt {prompt}, KV {kv_bytes / 1e6:.0f} MB/request, "
                    f"{args.link_gbps:g} GB/s link", title_justify="left")
    for tokens in (int(x) for x in args.output_tokens.split(",")):
        r = rates(prefill, decode, tokens, kv_bytes, args.link_gbps * 1e9)
        for name, value in sorted(r.items(), key=lambda kv: -kv[1]):
            t.add_row(str(tokens), name, f"{value:.3f}", f"{value / r['replicas']:.2f}x")
    console.print(t)


if __name__ == "__main__":
    main()
