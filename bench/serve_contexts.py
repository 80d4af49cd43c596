"""Benchmark: what the server's context buckets buy, a decode step attending the positions its
requests reach against one attending the whole context.

    python -m bench.serve_contexts --out DIR [--cpu] [--quick] [--batches 1,8,64] [--repeats 50] \
        [--shortest N]

The model is bench.serve_gpu's ``llama8b`` case (Llama 3 8B's shapes, seeded random bf16 weights on
GPU 0, 2048 tokens a slot; ``--cpu``: its tiny model on the CPU, the control flow only) in the
server's graph backend (:class:`~kernelfleet.serve.graphs.GraphBackend`) with as many slots as the
largest batch. It is built twice, in this order, each timed and its memory read:

* **one context bucket**, the baseline: the whole context only (``--shortest`` at the context),
  the graphs the server captured before context buckets;
* **context buckets**: ``--shortest`` and its doublings up to the context (the server's own).

For each batch B and context bucket L, the median of ``--repeats`` replays of that graph (after
one warm-up; the GPU synchronised around each), every row at position L - 1: ms per step, and the
whole-context graph's time over it. ``--quick``: batches 1 and 4, 3 repeats (what CI runs, with
``--cpu``). The JSON of the table goes to DIR/serve_contexts.json and is the last line.
"""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path

import torch
from pydantic import BaseModel

from bench import Parser, command_line
from bench.serve_gpu import CPU_CASES, GPU_CASES, comma_values, config_json
from bench.serve_prefill import timed


class Row(BaseModel):
    batch: int
    context: int  # the positions the graph attends
    step_ms: float
    whole_context_over_this: float  # the whole-context graph's step time over this one's


class Build(BaseModel):
    contexts: list[int]
    graphs: int
    capture_seconds: float
    memory_gib: float  # allocated on the device after the captures (weights, cache and graph pool)


class Report(BaseModel):
    command: str
    device: str
    torch: str
    slots: int
    context_tokens: int
    one_context_bucket: Build
    context_buckets: Build
    rows: list[Row]


def main() -> None:
    from kernelfleet.serve.graphs import SHORTEST_CONTEXT, GraphBackend

    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON")
    parser.add_argument("--cpu", action="store_true", help="the tiny model on the CPU: the control flow only")
    parser.add_argument("--batches", default="1,8,64", help="requests a step, comma-separated")
    parser.add_argument("--repeats", type=int, default=50, help="timed replays a cell (median)")
    parser.add_argument("--shortest", type=int, default=SHORTEST_CONTEXT, help="the shortest context bucket")
    parser.add_argument("--quick", action="store_true", help="batches 1,4, 3 replays each")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.repeats = "1,4", 3
    batches = comma_values(args.batches, "--batches", 1, "of requests", "bench.serve_contexts")
    if args.repeats < 1 or args.shortest < 1:
        raise SystemExit(f"bench.serve_contexts: --repeats and --shortest take 1 or more, got {args.repeats} "
                         f"and {args.shortest}")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit(f"bench.serve_contexts: torch {torch.__version__} sees no CUDA device; --cpu runs the dry "
                         "run")
    from kernelfleet.serve.backend import EagerBackend
    from kernelfleet.serve.model import load

    case = {c.name: c for c in (CPU_CASES if args.cpu else GPU_CASES)}["llama8b"]
    context, slots = case.context_tokens, max(batches)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(config_json(case.config))
        served = load(f"hf:{folder}", "cpu" if args.cpu else "cuda:0", 0, torch.float32 if args.cpu else torch.bfloat16)
    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    where = "the CPU" if args.cpu else torch.cuda.get_device_name(0)

    def built(shortest: int) -> tuple[GraphBackend, Build]:
        sync()
        started = time.perf_counter()
        backend = GraphBackend(EagerBackend(served.model, slots, context), graphs=not args.cpu, shortest=shortest)
        sync()
        seconds = time.perf_counter() - started
        memory = 0.0 if args.cpu else torch.cuda.memory_allocated(0) / 2**30
        return backend, Build(contexts=backend.lengths, graphs=len(backend.buckets), capture_seconds=seconds,
                              memory_gib=memory)

    def step_ms(backend: GraphBackend, size: int, length: int) -> float:
        bucket = backend.buckets[size, length]
        bucket.inputs.copy_(torch.tensor([[1] * size, [length - 1] * size]))
        if bucket.graph is None:  # the CPU twin
            return timed(lambda: bucket.forward(backend.eager_backend), args.repeats, sync) * 1e3
        return timed(bucket.graph.replay, args.repeats, sync) * 1e3

    print(f"command: {command_line()}")
    print(f"{where}, torch {torch.__version__}; the llama8b case's model, {slots} slots of {context} tokens, "
          f"median of {args.repeats} replays")
    with torch.inference_mode():
        whole, one = built(context)
        whole_ms = {size: step_ms(whole, size, context) for size in batches}
        del whole
        gc.collect()
        if not args.cpu:
            torch.cuda.empty_cache()
        backend, many = built(args.shortest)
        rows = []
        for size in batches:
            for length in backend.lengths:
                ms = step_ms(backend, size, length)
                rows.append(Row(batch=size, context=length, step_ms=ms, whole_context_over_this=whole_ms[size] / ms))
    for name, build in (("one context bucket", one), ("context buckets", many)):
        print(f"{name}: {build.graphs} graphs (contexts {', '.join(map(str, build.contexts))}) captured in "
              f"{build.capture_seconds:.1f} s, {build.memory_gib:.2f} GiB allocated after")
    print(f"{'batch':>5} {'context':>7} {'ms/step':>8} {'whole context / this':>21}")
    for size in batches:
        print(f"{size:>5} {'whole':>7} {whole_ms[size]:>8.3f} {'(baseline)':>21}")
        for row in (r for r in rows if r.batch == size):
            print(f"{size:>5} {row.context:>7} {row.step_ms:>8.3f} {row.whole_context_over_this:>20.2f}x")
    report = Report(command=command_line(), device=where, torch=torch.__version__, slots=slots,
                    context_tokens=context, one_context_bucket=one, context_buckets=many, rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_contexts.json").write_text(report.model_dump_json(indent=1))
    print(report.model_dump_json())


if __name__ == "__main__":
    main()
