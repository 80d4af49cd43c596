"""Record the data-parallel regression case on two GPUs, for the detector's tests.

    python -m bench.record_ddp_regression --out DIR [--clean 45] [--slow 45]

A small data-parallel training job (torch.distributed, NCCL, DDP over every GPU of the
machine, one process per GPU started by torchrun, job label KERNELFLEET_JOB=ddp-train)
runs cleanly for ``--clean`` seconds, then for ``--slow`` seconds with a deliberate
inefficiency of the commonest kind: every rank logs its loss with ``loss.item()`` (a host
synchronisation per step) and rank 1's input pipeline stalls 20 ms per batch, so the
NCCL all-reduce makes every rank wait for it. ``kernelfleet record`` samples all GPUs
meanwhile. Writes DIR/h200x2-ddp.jsonl.gz and DIR/h200x2-ddp.phases.json (the wall-clock
phase boundaries and the step times each rank measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import Parser

JOB = "ddp-train"


def worker(clean: float, slow: float, phases: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    width, layers, tokens = 4096, 8, 8192
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    model = DistributedDataParallel(model.to("cuda", torch.bfloat16))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    record = {"rank": rank, "pid": os.getpid()}
    for phase, seconds in (("clean", clean), ("slow", slow)):
        dist.barrier()
        start, steps = time.time(), 0
        # every rank stops after the same number of steps: rank 0 decides when time is up
        while True:
            if phase == "slow" and rank == 1:
                time.sleep(0.020)  # the stalled input pipeline
            loss = step()
            if phase == "slow":
                loss.item()  # per-step logging: a host synchronisation
            steps += 1
            if steps % 10 == 0:
                done = torch.tensor([time.time() - start >= seconds], device="cuda")
                dist.broadcast(done, 0)
                if done.item():
                    break
        torch.cuda.synchronize()
        end = time.time()
        record[phase] = {"start": start, "end": end, "steps": steps, "step_ms": (end - start) / steps * 1e3}
    phases.with_suffix(f".rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def main() -> None:
    parser = Parser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--clean", type=float, default=45.0)
    parser.add_argument("--slow", type=float, default=45.0)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # set by the launcher for torchrun
    args = parser.parse_args()
    if args.worker:
        worker(args.clean, args.slow, args.worker)
        return
    if args.out is None:
        parser.error("--out DIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    gpus = torch.cuda.device_count()
    trace, phases = args.out / "h200x2-ddp.jsonl.gz", args.out / "h200x2-ddp.phases.json"
    seconds = args.clean + args.slow + 25
    note = (f"DDP over {gpus} GPUs (job {JOB}): {args.clean:.0f} s clean, then {args.slow:.0f} s with "
            f"loss.item() per step and a 20-ms input stall on rank 1")
    recorder = subprocess.Popen([sys.executable, "-m", "kernelfleet", "record", "-o", str(trace),
                                 "--duration", str(seconds), "--note", note])
    time.sleep(3.0)
    env = dict(os.environ, KERNELFLEET_JOB=JOB, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1")
    started = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                    "-m", "bench.record_ddp_regression", "--worker", str(phases), "--clean", str(args.clean),
                    "--slow", str(args.slow)],
                   env=env, check=True)
    recorder.wait()
    ranks = [json.loads(p.read_text()) for p in sorted(args.out.glob("h200x2-ddp.phases.rank*.json"))]
    for p in args.out.glob("h200x2-ddp.phases.rank*.json"):
        p.unlink()
    phases.write_text(json.dumps({"command": f"python -m bench.record_ddp_regression --out DIR --clean {args.clean} "
                                  f"--slow {args.slow}", "launched": started, "gpus": gpus, "job": JOB,
                                  "ranks": ranks}, indent=1))
    for r in ranks:
        print(f"rank {r['rank']}: clean {r['clean']['step_ms']:.1f} ms/step ({r['clean']['steps']} steps), "
              f"slow {r['slow']['step_ms']:.1f} ms/step ({r['slow']['steps']} steps)")


if __name__ == "__main__":
    main()
