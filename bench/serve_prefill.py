"""Benchmark: what the server's eager prefill costs on a GPU, prompts one at a time against several
in one forward (``kernelfleet serve --prefill-batch``).

    python -m bench.serve_prefill --out DIR [--cpu] [--quick] [--lengths 64,128,256,512] [--batches 1,2,4,8] \
        [--repeats 5]

The model is bench.serve_gpu's ``llama8b`` case (Llama 3 8B's shapes, seeded random bf16 weights on
GPU 0; ``--cpu``: its tiny model on the CPU, the control flow only) in the server's backend,
:class:`~kernelfleet.serve.backend.EagerBackend`, with as many slots as the largest batch and the
server's 2048 tokens a slot. For each prompt length L and batch K, the median of ``--repeats``
timed runs (after one warm-up; the GPU synchronised before and after):

* **one at a time**, the baseline: K prompts of L tokens, each its own ``prefill`` (what the server
  runs at ``--prefill-batch 1``);
* **together**: the same K prompts in one ``prefill_many`` forward.

Then the same for K prompts of mixed lengths, uniform in 64-512 (the serve benchmark's prompts),
right-aligned to the longest. Printed: ms per forward and per prompt each way, and together's
speed-up over one at a time. ``--quick`` times lengths 16 and 64, batches 1 and 4, once each (what
CI runs, with ``--cpu``). The JSON of the table goes to DIR/serve_prefill.json and is the last line.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel

from bench import Parser, command_line
from bench.serve_gpu import CPU_CASES, GPU_CASES, comma_values, config_json, prompt_of

MIXED = "64-512"  # the serve benchmark's prompt lengths


class Row(BaseModel):
    prompt_tokens: str  # one length, or MIXED
    batch: int
    one_at_a_time_ms: float  # K prefills one after another
    together_ms: float  # one forward of the K prompts
    speedup: float


class Report(BaseModel):
    command: str
    device: str
    torch: str
    rows: list[Row]


def timed(run: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """The median seconds of ``run`` over ``repeats`` runs after one warm-up."""
    run()
    seconds = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        run()
        sync()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON")
    parser.add_argument("--cpu", action="store_true", help="the tiny model on the CPU: the control flow only")
    parser.add_argument("--lengths", default="64,128,256,512", help="prompt lengths, comma-separated")
    parser.add_argument("--batches", default="1,2,4,8", help="prompts a forward, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs a cell (median)")
    parser.add_argument("--quick", action="store_true", help="lengths 16,64, batches 1,4, one run each")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.batches, args.repeats = "16,64", "1,4", 1
    lengths = comma_values(args.lengths, "--lengths", 1, "of tokens", "bench.serve_prefill")
    batches = comma_values(args.batches, "--batches", 1, "of prompts", "bench.serve_prefill")
    if args.repeats < 1:
        raise SystemExit(f"bench.serve_prefill: --repeats takes 1 or more, got {args.repeats}")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit(f"bench.serve_prefill: torch {torch.__version__} sees no CUDA device; --cpu runs the dry run")
    from kernelfleet.serve.backend import EagerBackend
    from kernelfleet.serve.model import load

    case = {c.name: c for c in (CPU_CASES if args.cpu else GPU_CASES)}["llama8b"]
    device = "cpu" if args.cpu else "cuda:0"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(config_json(case.config))
        served = load(f"hf:{folder}", device, 0, torch.float32 if args.cpu else torch.bfloat16)
    lengths = [min(length, case.context_tokens - 1) for length in lengths]
    backend = EagerBackend(served.model, max(batches), case.context_tokens)
    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    rng = random.Random(3)
    low, high = (min(64, case.context_tokens // 4), min(512, case.context_tokens - 1))
    where = "the CPU" if args.cpu else torch.cuda.get_device_name(0)
    print(f"command: {command_line()}")
    print(f"{where}, torch {torch.__version__}; llama8b's shapes, {case.context_tokens} tokens a slot, "
          f"median of {args.repeats}")
    print(f"{'prompt tokens':>13} {'batch':>5} {'one at a time ms':>16} {'per prompt':>10} {'together ms':>11} "
          f"{'per prompt':>10} {'speed-up':>8}")
    rows = []
    for length in [*lengths, MIXED]:
        for batch in batches:
            sizes = [rng.randint(low, high) for _ in range(batch)] if length == MIXED else [length] * batch
            prompts = [prompt_of(i, size, served.vocab_size) for i, size in enumerate(sizes)]
            slots = list(range(batch))
            with torch.inference_mode():
                alone = timed(lambda: [backend.prefill(s, p) for s, p in zip(slots, prompts)], args.repeats, sync)
                together = timed(lambda: backend.prefill_many(slots, prompts), args.repeats, sync)
            rows.append(Row(prompt_tokens=str(length), batch=batch, one_at_a_time_ms=alone * 1e3,
                            together_ms=together * 1e3, speedup=alone / together))
            r = rows[-1]
            print(f"{r.prompt_tokens:>13} {batch:>5} {r.one_at_a_time_ms:>16.2f} {r.one_at_a_time_ms / batch:>10.2f} "
                  f"{r.together_ms:>11.2f} {r.together_ms / batch:>10.2f} {r.speedup:>7.2f}x", flush=True)
    report = Report(command=command_line(), device=where, torch=torch.__version__, rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_prefill.json").write_text(report.model_dump_json(indent=1))
    print(report.model_dump_json())


if __name__ == "__main__":
    main()
