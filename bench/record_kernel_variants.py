"""Record one transformers model step captured with different kernels for the same ops (runs on a GPU).

    python -m bench.record_kernel_variants --out DIR

The small random-weight Llama of ``kernelfleet.workloads.steps.hf_llama`` (prefill over a fixed
prompt) is captured once per attention backend SDPA can use here — the default (cuDNN on an
H200), the math composition and flash attention — with its ATen ops recorded. Each capture's graph
is replayed and its logits kept. This is what a device that picks other kernels would capture (the
place half's "each device captures for itself"), recorded so the op matching and the gate for
different kernels are tested on the CPU: ``DIR/<variant>.capture.json.gz``, ``DIR/logits.pt``
(every variant's logits, bf16 as computed) and ``DIR/variants.json`` (the table printed last:
launches, kernels, ops, how many op positions launch other kernels than the default's, and the
logits' cosine, largest difference, argmax agreement and the reference's top-2 margin at every
position where the argmax differs).
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench import Parser, command_line
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import capture
from kernelfleet.workloads.steps import hf_llama

VARIANTS = {"default": None, "math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION}


def kernels_by_op(raw) -> list[tuple[str, tuple[str, ...]]]:
    """Each recorded ATen op and the kernel names of the graph nodes it made, in capture order."""
    return [(op.name, tuple(raw.nodes[i].name for i in range(op.first, op.end) if raw.nodes[i].kind == "kernel"))
            for op in raw.ops]


def counts(raw) -> dict:
    """A capture's launches, ATen ops and distinct kernels."""
    return {"launches": len(assemble(raw).launches), "ops": len(raw.ops),
            "kernels": len({n.name for n in raw.nodes if n.kind == "kernel"})}


def other_kernels(base: list, mine: list) -> dict:
    """How one capture's ops (``kernels_by_op``) compare with another's: the same op names in order,
    and the op positions that launch other kernels."""
    return {"op_names_equal": [op for op, _ in base] == [op for op, _ in mine],
            "op_positions_with_other_kernels": sum(a != b for a, b in zip(base, mine))}


def saved(path: Path, key: str, found: dict) -> dict:
    """``found`` under ``key``, with the command, the GPU and torch, written to ``path`` as JSON."""
    summary = {"command": command_line(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               key: found}
    path.write_text(json.dumps(summary, indent=1))
    return summary


def compare(reference: torch.Tensor, other: torch.Tensor) -> dict:
    a, b = reference.float().flatten(0, -2), other.float().flatten(0, -2)  # positions x vocabulary
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    top2 = a.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    differ = a.argmax(-1) != b.argmax(-1)
    return {"min_cosine": float(cosine.min()), "max_abs_difference": float((a - b).abs().max()),
            "argmax_agreement": float(1 - differ.float().mean()), "positions": int(a.shape[0]),
            "argmax_differs_at": int(differ.sum()),
            "reference_margin_where_argmax_differs": sorted(float(m) for m in margin[differ]),
            "reference_margin_percentiles": {f"p{q}": float(margin.quantile(q / 100)) for q in (1, 5, 50)}}


def main() -> None:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    step = hf_llama("prefill")
    found, logits, ops = {}, {}, {}
    for name, backend in VARIANTS.items():
        try:
            with sdpa_kernel(backend) if backend is not None else nullcontext():
                captured = capture(step.fn, step.args, module=step.module, what=f"hf-llama-prefill-{name}")
        except RuntimeError as exc:  # a backend with no kernel for this shape is reported, not fatal
            found[name] = {"refused": str(exc).splitlines()[0]}
            print(f"{name}: no capture ({found[name]['refused']})", flush=True)
            continue
        captured.replay()
        torch.cuda.synchronize()
        logits[name] = captured.output_tensors()[0].detach().clone().cpu()
        captured.raw.save(args.out / f"{name}.capture.json.gz")
        ops[name] = kernels_by_op(captured.raw)
        found[name] = counts(captured.raw)
    torch.save(logits, args.out / "logits.pt")
    base = ops.get("default", [])
    for name in logits:
        same = other_kernels(base, ops[name])
        found[name]["op_sequence_equals_default"] = same["op_names_equal"]
        found[name]["op_positions_with_other_kernels"] = same["op_positions_with_other_kernels"]
        if name != "default" and "default" in logits:
            found[name]["against_default"] = compare(logits["default"], logits[name])
    summary = saved(args.out / "variants.json", "variants", found)
    print(f"{'variant':<8} {'launches':>8} {'ops':>5} {'kernels':>7} {'ops other kernels':>17} "
          f"{'min cos':>9} {'max |d|':>8} {'argmax':>7} {'max margin at a flip':>20}")
    for name, row in found.items():
        if "refused" in row:
            print(f"{name:<8} refused: {row['refused'][:90]}")
            continue
        vs = row.get("against_default", {})
        flips = vs.get("reference_margin_where_argmax_differs", [])
        print(f"{name:<8} {row['launches']:>8} {row['ops']:>5} {row['kernels']:>7} "
              f"{row['op_positions_with_other_kernels']:>17} {vs.get('min_cosine', 1.0):>9.6f} "
              f"{vs.get('max_abs_difference', 0.0):>8.4f} {vs.get('argmax_agreement', 1.0):>7.4f} "
              f"{max(flips) if flips else 0.0:>20.4f}")
    print(f"command: {summary['command']}")


if __name__ == "__main__":
    main()
