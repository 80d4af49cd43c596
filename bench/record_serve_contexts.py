"""Record the server's decode step captured at two context lengths (runs on a GPU).

    python -m bench.record_serve_contexts --out DIR

The placed server carries each plan, made for its decode step attending the whole context, to the
same step attending fewer positions (``graph/units.carried``): the libraries launch other kernels,
even another number of them, as the context changes. This records what that looks like on a GPU,
so the carrying is tested on the CPU on real captures: a 2-layer Llama with the 8B's attention
shape (head dim 128, 4 query heads a KV head; seeded random weights, bf16), 8 slots of 2,048
tokens, its batch-8 decode step (``serve/placed_step.decode_step``) captured attending the whole
context and attending 128 positions, each with its ATen ops: ``DIR/whole.capture.json.gz``,
``DIR/c128.capture.json.gz`` and ``DIR/contexts.json`` (the table printed last: launches, ops,
kernels, and the op positions whose kernels differ from the whole context's).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from bench import Parser
from bench.record_kernel_variants import counts, kernels_by_op, other_kernels, saved
from kernelfleet.kernels.cuda.capture import capture

SLOTS, CONTEXT, SHORT = 8, 2048, 128


def main() -> None:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.record_serve_contexts: it captures CUDA graphs and needs a GPU")
    from transformers import LlamaConfig

    from kernelfleet.serve.backend import EagerBackend
    from kernelfleet.serve.placed_step import decode_step
    from kernelfleet.workloads.targets import causal_lm

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2,
                    max_position_embeddings=4096).save_pretrained(folder)
        backend = EagerBackend(causal_lm(Path(folder), "cuda:0", 0, torch.bfloat16), SLOTS, CONTEXT)
    found, ops = {}, {}
    for name, length in (("whole", None), (f"c{SHORT}", SHORT)):
        step = decode_step(backend, SLOTS, length=length)
        captured = capture(step.fn, step.args, module=step.module, what=step.name)
        captured.raw.save(args.out / f"{name}.capture.json.gz")
        ops[name] = kernels_by_op(captured.raw)
        found[name] = {"attends": length or CONTEXT, **counts(captured.raw)}
    for name, mine in ops.items():
        same = other_kernels(ops["whole"], mine)
        found[name]["op_names_equal_whole"] = same["op_names_equal"]
        found[name]["op_positions_with_other_kernels"] = same["op_positions_with_other_kernels"]
    summary = saved(args.out / "contexts.json", "contexts", found)
    print(f"{'capture':<8} {'attends':>7} {'launches':>8} {'ops':>5} {'kernels':>7} {'same op names':>13} "
          f"{'ops other kernels':>17}")
    for name, row in found.items():
        print(f"{name:<8} {row['attends']:>7} {row['launches']:>8} {row['ops']:>5} {row['kernels']:>7} "
              f"{row['op_names_equal_whole']!s:>13} {row['op_positions_with_other_kernels']:>17}")
    print(f"command: {summary['command']}")


if __name__ == "__main__":
    main()
