"""Plans for the 8B Llama steps on costs measured on the emulated H200 pair (CPU only).

    python3 bench/plan_measured.py --out DIR [--link-gbps 25] [--time-limit 60]

Builds each step's program from its committed capture (tests/data/h200-capture) and its cost
table from the per-kernel times measured there on the "compute" (56 SMs + 64-SM hog) and
"bandwidth" (32 SMs) profiles, writes both as JSON, and runs ``kernelfleet plan --policy all`` on
them (every baseline beside the MILP, with a Gantt chart of the throughput plan). First it prints
the roofline cost model's leave-one-device-out error on the three measured profiles (compute,
bandwidth, whole H200), each described by its calibrated GEMM FLOP/s and GEMV bytes/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from kernelfleet.catalog import Catalog
from kernelfleet.graph.deps import kernel_kind
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.profile.costmodel import leave_one_out
from kernelfleet.profile.roofline import Capability
from kernelfleet.profile.table import cost_table, preference

DATA = Path(__file__).parents[1] / "tests" / "data" / "h200-capture"
STEPS = ("llama8b-decode", "llama8b-prefill")


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
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--link-gbps", type=float, default=25.0)
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"command: {' '.join([sys.executable] + sys.argv)}", flush=True)
    for step in STEPS:
        raw = RawCapture.load(DATA / f"{step}.capture.json.gz")
        program = assemble(raw)
        profile = json.loads((DATA / f"{step}.profile.json").read_text())
        seconds = {name: p["seconds"] for name, p in profile["profiles"].items() if name != "whole"}
        costs = cost_table(raw, program, seconds, f"measured on the emulated H200 pair ({step})")
        (args.out / f"{step}.program.json").write_text(program.to_json())
        (args.out / f"{step}.costs.json").write_text(costs.to_json())
        model_error(raw, program, profile)
        p = preference(costs, "compute", "bandwidth")
        whole = sum(profile["profiles"]["whole"]["seconds"])
        print(f"{step}: compute {sum(seconds['compute']) * 1e3:.1f} ms, bandwidth {sum(seconds['bandwidth']) * 1e3:.1f} ms, "
              f"whole H200 {whole * 1e3:.1f} ms per step; {p.kernels_faster_on_weaker} of {p.kernels} kernels "
              f"({p.share_of_kernels:.0%}, {p.share_of_time:.0%} of {p.stronger}'s time) run faster on the slower "
              f"{p.weaker}", flush=True)
        subprocess.run([sys.executable, "-m", "kernelfleet", "plan", str(args.out / f"{step}.program.json"),
                        str(args.out / f"{step}.costs.json"), "--link", f"compute:bandwidth:{args.link_gbps}",
                        "--policy", "all", "--out", str(args.out / f"{step}-plans"),
                        "--gantt", str(args.out / f"{step}-gantt.png"), "--time-limit", str(args.time_limit)],
                       check=True)


if __name__ == "__main__":
    main()
