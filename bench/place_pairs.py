"""Benchmark: every placement strategy for the reference workloads and transformers models, on the
same-kernel and the different-kernel pair of one H200, through the commands a user runs:

    python -m bench.place_pairs --out DIR [--targets NAME ...] [--pairs same different] [--budget-s 540]
        [--phases profile plan disagg] [--work DIR] [--resume]

For each (target, pair) it runs

    kernelfleet profile TARGET --profile a:64 --profile b:32[/math-attention] --out PROFILE
    kernelfleet plan PROFILE/program.json PROFILE/costs.json --device a --device b --policy all
        --in-flight SLOTS --out PLANS
    kernelfleet bench disagg TARGET --plans PLANS --device a:64@0 --device b:32@0[/math-attention]
        --slots SLOTS --costs PROFILE/costs.json

(``profile`` times the whole GPU too, and each device's whole step as one graph alone, with its
copies free and with the other device busy: ``graph_seconds``, ``graph_seconds_free``,
``graph_seconds_shared`` in the cost table (the link between the devices only with
``profile --measure-link``, which this does not pass: docs/place.md), which ``plan`` and ``bench
disagg`` predict with; ``runs.json`` lists which of them each row's table holds; the plans are for
the pair) and keeps, under ``DIR/TARGET.PAIR/``, the cost table, the program (gzipped), the plans,
bench disagg's ``disagg.json`` and the commands with their output (``log.txt``). Rows run in the order
given until ``--budget-s`` is spent; the rest are listed as not run. ``--resume`` keeps the rows an
earlier run of the same ``--out`` finished (their ``disagg.json`` is there) and runs the others, so
a table larger than one device call is made in several. ``python -m bench.place_table
DIR`` makes the table of measured against predicted from what this writes (on any machine).

The targets: the six reference workloads (tiny presets: four replicas of an 8B step do not fit one
H200), Llama and Qwen2-MoE from transformers, prefill and decode, and Mamba's decode (recurrent
state), built from small configs (seeded random weights). Device b of the different-kernel pair
captures with SDPA's math attention.

On a machine of two GPUs, ``--pairs same-x2 different-x2 gpus`` runs the two-GPU rows (issue 20): the
same two pairs with b on GPU 1, and two whole GPUs, b capturing its own kernels (math attention) on GPU 1.
``--phases profile plan disagg nccl`` then also runs each row's plans a process per GPU:

    torchrun --nproc-per-node 2 -m kernelfleet bench disagg-nccl TARGET --plans PLANS --device a:64@0
        --device b:32@1[/math-attention] --slots SLOTS --costs PROFILE/costs.json

kept as ``disagg-nccl.json`` (NCCL runs one process a GPU, so a pair on one GPU cannot).
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import Parser, command_line
from kernelfleet.costs.table import GRAPHS
from kernelfleet.profile.run import parse_profile
from kernelfleet.runtime.plans import plan_files
from kernelfleet.serve.plan_buckets import on_gpu

REFERENCE = ("llama-decode", "llama-prefill", "moe-decode", "mamba-decode", "vlm-prefill", "dit-denoise")
TRANSFORMERS = ("hf-llama-prefill", "hf-llama-decode", "hf-qwen2moe-prefill", "hf-qwen2moe-decode", "hf-mamba-decode")
PAIRS = {"same": ("a:64", "b:32"), "different": ("a:64", "b:32/math-attention"),
         # issue 20's, on a machine of two GPUs: the same two pairs with b on GPU 1 (what the one-GPU pairs' shared
         # memory system and power cap did to each strategy), and two whole GPUs, each capturing its own kernels
         "same-x2": ("a:64", "b:32@1"), "different-x2": ("a:64", "b:32@1/math-attention"),
         "gpus": ("a", "b@1/math-attention")}
SIZES = {"vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 4, "max_position_embeddings": 256}


def target_of(name: str, folder: Path) -> str:
    """The TARGET a row name stands for: a reference step by name, or a transformers step of a
    config-only directory written under ``folder`` (decode: batch 4 into a 128-token static cache;
    prefill: batch 4 of 64 tokens)."""
    if name not in TRANSFORMERS or name == "hf-llama-prefill":  # the latter is a reference builder
        return name
    from transformers import LlamaConfig, MambaConfig, Qwen2MoeConfig

    model = name.rsplit("-", 1)[0]
    if model == "hf-mamba":
        config = MambaConfig(vocab_size=SIZES["vocab_size"], hidden_size=SIZES["hidden_size"], state_size=16,
                             num_hidden_layers=SIZES["num_hidden_layers"])
    elif model == "hf-llama":
        config = LlamaConfig(intermediate_size=688, **SIZES)
    else:
        config = Qwen2MoeConfig(intermediate_size=688, moe_intermediate_size=128, shared_expert_intermediate_size=256,
                                num_experts=8, num_experts_per_tok=2, **SIZES)
    config.save_pretrained(folder / model)
    phase = "decode,batch=4,context=128" if name.endswith("decode") else "batch=4,tokens=64"
    return f"hf:{folder / model},{phase}"


PHASES = ("profile", "plan", "disagg", "nccl")  # nccl: bench disagg-nccl, a process per GPU (two GPUs only)
DEFAULT_PHASES = PHASES[:3]


def run_row(name: str, pair: str, out: Path, work: Path, slots: int, repeats: int, trials: int,
            phases: tuple[str, ...] = DEFAULT_PHASES) -> dict:
    """One (target, pair): the commands of ``phases`` (each reads what the one before left under
    ``work``), what they kept under ``out``, and how long each took."""
    target = target_of(name, work)
    profile, plans, runs = work / f"{name}.{pair}.profile", work / f"{name}.{pair}.plans", work / f"{name}.{pair}.runs"
    a, b = PAIRS[pair]
    kernelfleet = ["-m", "kernelfleet"]
    commands = [kernelfleet + args for args in (
        ["profile", target, "--profile", a, "--profile", b, "--trials", str(trials), "--out", str(profile)],
        ["plan", str(profile / "program.json"), str(profile / "costs.json"), "--device", "a", "--device", "b",
         "--policy", "all", "--in-flight", str(slots), "--out", str(plans)],
        ["bench", "disagg", target, "--plans", str(plans), "--device", on_gpu(a), "--device", on_gpu(b),
         "--slots", str(slots), "--repeats", str(repeats), "--costs", str(profile / "costs.json"), "--out", str(runs)],
    )]
    commands.append(["-m", "torch.distributed.run", "--nproc-per-node", "2", *kernelfleet, "bench", "disagg-nccl",
                     target, "--plans", str(plans), "--device", on_gpu(a), "--device", on_gpu(b), "--slots", str(slots),
                     "--repeats", str(repeats), "--costs", str(profile / "costs.json"), "--out", str(runs)])
    out.mkdir(parents=True, exist_ok=True)
    row = {"target": name, "pair": pair, "seconds": {}}
    with (out / "log.txt").open("w" if "profile" in phases else "a") as log:
        for phase, args in zip(PHASES, commands):
            if phase not in phases:
                continue
            began = time.monotonic()
            done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=420,
                                  check=False)  # a failed command is kept in the log
            row["seconds"][phase] = round(time.monotonic() - began, 1)
            log.write(f"$ python {' '.join(args)}\n{done.stdout}{done.stderr}\nexit {done.returncode}\n\n")
            if done.returncode != 0:  # its one-line error where it gave one (under torchrun, before torchrun's own)
                said = [line for line in done.stderr.splitlines() if line.startswith("kernelfleet: error:")]
                row["failed"] = f"{phase} exited {done.returncode}: {said[0] if said else done.stderr.strip()[-300:]}"
                return row
    if "profile" in phases:
        shutil.copy(profile / "costs.json", out / "costs.json")
        with gzip.open(out / "program.json.gz", "wt") as program:
            program.write((profile / "program.json").read_text())
    if "plan" in phases:
        for plan in plan_files(plans):  # the program they place is kept once, above
            shutil.copy(plan, out / f"plan.{plan.name}")
    for phase, report in (("disagg", "disagg.json"), ("nccl", "disagg-nccl.json")):
        if phase in phases:
            shutil.copy(runs / report, out / report)
    costs = json.loads((profile / "costs.json").read_text())
    # what the predictions could use
    row["graph_times"] = [name for name in (*GRAPHS, "graph_seconds_together", "links") if costs.get(name)]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for one sub-folder per (target, pair).")
    parser.add_argument("--targets", nargs="+", default=[*REFERENCE, *TRANSFORMERS],
                        choices=[*REFERENCE, *TRANSFORMERS])
    parser.add_argument("--pairs", nargs="+", default=["different", "same"], choices=list(PAIRS))
    parser.add_argument("--slots", type=int, default=2, help="Micro-batches per graph (requests in flight).")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--trials", type=int, default=3, help="Profile trials per launch.")
    parser.add_argument("--budget-s", type=float, default=540.0, help="Start no row after this many seconds.")
    parser.add_argument("--phases", nargs="+", default=list(DEFAULT_PHASES), choices=PHASES,
                        help="The commands to run (in order): profile and disagg need the GPU, plan only the CPU, "
                             "so a run may profile on the GPU, plan elsewhere and come back to time; nccl (not by "
                             "default) runs bench disagg-nccl under torchrun, a process per device, for pairs on two "
                             "GPUs.")
    parser.add_argument("--work", type=Path, help="Keep the commands' own folders here (for a later --phases); "
                                                  "default: a temporary folder.")
    parser.add_argument("--resume", action="store_true",
                        help="Keep the rows an earlier run into --out finished; run only the others.")
    args = parser.parse_args(argv)
    one_gpu = [p for p in args.pairs if len({parse_profile(spec).device for spec in PAIRS[p]}) < 2]
    if "nccl" in args.phases and one_gpu:
        parser.error(f"--phases nccl needs each pair on two GPUs (NCCL runs one process a GPU): {', '.join(one_gpu)} "
                     "is on one")
    last = "disagg-nccl.json" if "nccl" in args.phases else "disagg.json"
    began, rows, skipped, kept = time.monotonic(), [], [], 0
    wanted = [(pair, name) for pair in args.pairs for name in args.targets]
    runs = args.out / "runs.json"
    earlier = json.loads(runs.read_text()) if runs.exists() else None
    finished = {} if earlier is None or not args.resume else {
        (r["pair"], r["target"]): r for r in earlier["rows"]
        if "failed" not in r and (args.out / f"{r['target']}.{r['pair']}" / last).exists()}
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        for index, (pair, name) in enumerate(wanted):
            if (pair, name) in finished:
                rows.append(finished[pair, name])
                kept += 1
                continue
            if time.monotonic() - began > args.budget_s:
                skipped.append(f"{name}.{pair}")
                continue
            print(f"[{index + 1}/{len(wanted)}] {name} on pair {pair}: {' '.join(args.phases)}", flush=True)
            row = run_row(name, pair, args.out / f"{name}.{pair}", work, args.slots, args.repeats, args.trials,
                          tuple(p for p in PHASES if p in args.phases))
            print(f"    {row.get('failed', 'done')} ({row['seconds']} s)", flush=True)
            rows.append(row)
    summary = {"command": command_line(), "rows": rows, "not_run": skipped,
               "seconds": round(time.monotonic() - began, 1)}
    if earlier is not None and args.phases != list(DEFAULT_PHASES):  # a later phase adds its seconds to earlier rows
        before = {(r["target"], r["pair"]): r for r in earlier["rows"]}
        for row in rows:
            row["seconds"] = {**before.get((row["target"], row["pair"]), {}).get("seconds", {}), **row["seconds"]}
    if earlier is not None and (args.phases != list(DEFAULT_PHASES) or kept):
        summary["command"] = f"{earlier['command']} && {summary['command']}"
    runs.write_text(json.dumps(summary, indent=1))
    print(f"\n{command_line()}\n{len(rows) - kept} rows run, {kept} kept from an earlier run, "
          f"{len(skipped)} not run (budget): {' '.join(skipped) or '-'}")
    print(json.dumps(summary))
    return 0 if all("failed" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
