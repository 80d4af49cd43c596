"""Captures of the reference workloads recorded on an H200 (bench/capture_run.py), replayed on the CPU.

Each ``*.capture.json.gz`` is what the GPU gave (graph nodes, raw parameter bytes, ATen ops,
allocator blocks, PTX); each ``*.observed.json.gz`` is what replaying that same capture node by node
on the GPU observed (memory-diff writes, probed address ranges, the bit-exact check of node-by-node
against graph replay). ``*.profile.json`` holds per-launch seconds on the emulated pair.
"""

import gzip
import json
from pathlib import Path

import pytest
import torch

from kernelfleet.analyze import census
from kernelfleet.graph.deps import dependencies, kernel_kind
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.checks import probe_disagreements, unsound_writes
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.profile.calibration import Calibration, pick_pair, targets
from kernelfleet.profile.table import cost_table, preference
from kernelfleet.workloads import preset
from kernelfleet.workloads.llama import Transformer

pytestmark = pytest.mark.replay

HERE = Path(__file__).parents[1] / "data" / "h200-capture"
STEPS = ["llama-decode", "llama-prefill", "llama-decode-compiled", "moe-decode", "mamba-decode", "vlm-prefill",
         "dit-denoise", "llama8b-decode", "llama8b-prefill", "hf-llama-prefill", "hf-llama-prefill-compiled"]
EAGER = [s for s in STEPS if "compiled" not in s]


def load(step: str):
    raw = RawCapture.load(HERE / f"{step}.capture.json.gz")
    observed = json.loads(gzip.decompress((HERE / f"{step}.observed.json.gz").read_bytes()))
    return raw, assemble(raw), observed


@pytest.mark.parametrize("step", STEPS)
def test_every_claim_holds_against_the_gpu_replay(step):
    raw, program, observed = load(step)
    assert observed["stepwise"]["bit_identical"] is True, "node-by-node replay must reproduce the graph's outputs"
    assert observed["order"]["backward_edges"] == [], "creation order is a topological order"
    writes = {int(k): [tuple(r) for r in v] for k, v in observed["observed"]["writes"].items()}
    probed = {int(k): [tuple(r) for r in v] for k, v in observed["observed"]["probed"].items()}
    assert writes, "the replay saw writes"
    assert unsound_writes(program, writes) == []
    assert probe_disagreements(program, probed) == []
    kernels = [launch for launch in program.launches if launch.kind == "kernel"]
    assert all(launch.accesses for launch in kernels), "every kernel touches some buffer"


@pytest.mark.parametrize("step", EAGER)
def test_eager_steps_are_fully_known_from_schemas(step):
    raw, program, _ = load(step)
    numbers = census(program, dependencies(program))
    assert numbers["pinned"] == 0
    assert numbers["launches_by_source"].get("schema", 0) == numbers["kernels"]
    assert set(numbers["launches_by_source"]) <= {"schema", "graph-node"}
    # cuBLAS passes its arguments as one `extra` buffer: the pointers inside it were found
    nvjet = [launch for launch in program.launches if launch.name.startswith("nvjet")]
    assert nvjet and all(any(p.pointers for p in launch.params) for launch in nvjet)


@pytest.mark.parametrize("step", [s for s in STEPS if "compiled" in s])
def test_compiled_step_uses_triton_ptx(step):
    raw, program, observed = load(step)
    triton = [launch for launch in program.launches if launch.name.startswith("triton_")]
    assert triton and all(raw.ptx.get(launch.name) for launch in triton), "every Triton kernel's PTX was found"
    static = [launch for launch in triton if {a.source for a in launch.accesses} == {"ptx-static"}]
    assert len(static) >= len(triton) - 2
    # the embedding kernels call __assertfail on an out-of-range index; that call touches no user memory
    embedding = [launch for launch in triton if "embedding" in launch.name]
    assert embedding and not any(launch.pinned for launch in embedding)
    assert len(observed["observed"]["probed"]) >= 9
    # cuBLAS kernels launched by generated code belong to no ATen op: conservative and pinned
    library = [launch for launch in program.launches if launch.name.startswith("nvjet")]
    assert library and all(launch.pinned and "no PTX and no ATen op" in launch.pinned for launch in library)


def test_census_of_the_8b_decode_step():
    _, program, _ = load("llama8b-decode")
    numbers = census(program, dependencies(program))
    assert (numbers["launches"], numbers["kernels"], numbers["copies"]) == (1975, 1974, 1)
    assert numbers["kinds"] == {"memory-bound": 1718, "tensor-core": 257}
    assert numbers["buffer_roles"]["weight"] == 291  # 32 layers x 9 tensors + embedding, norm, head


def shape(raw: RawCapture) -> list[tuple]:
    return [(n.kind, n.name, n.grid, n.block) for n in raw.nodes]


def costs(step: str):
    raw, program, _ = load(step)
    # the profile ran in a process of its own (green contexts never precede the checks): its capture
    # must be the same program, launch for launch, for its times to apply to this one
    assert shape(RawCapture.load(HERE / f"{step}.profiled-capture.json.gz")) == shape(raw)
    profile = json.loads((HERE / f"{step}.profile.json").read_text())
    seconds = {name: p["seconds"] for name, p in profile["profiles"].items()}
    return cost_table(raw, program, seconds, f"measured on H200 profiles ({step})"), profile


def test_cost_table_flops_match_the_model():
    with torch.device("meta"):
        model = Transformer(preset("llama", "h200"))
    decode, _ = costs("llama8b-decode")
    assert sum(f or 0 for f in decode.flops) == model.decode_flops(16, 4096)
    prefill, _ = costs("llama8b-prefill")
    # PyTorch's SDPA formula counts all S² query-key pairs; the model's formula counts S² as well but
    # the projections' FLOPs agree exactly, so the totals differ only by the attention convention.
    ratio = sum(f or 0 for f in prefill.flops) / model.prefill_flops(1, 2048)
    assert 1.0 <= ratio < 1.05
    assert {p for p in prefill.precision if p} == {"bf16"}


def test_which_device_each_kernel_prefers():
    decode, _ = costs("llama8b-decode")
    p = preference(decode, "compute", "bandwidth")
    whole = sum(row["whole"] for row in decode.seconds)
    assert whole < p.stronger_total_seconds, "the whole GPU beats either partition"
    assert p.weaker == "bandwidth" and p.share_of_kernels > 0.5
    prefill, _ = costs("llama8b-prefill")
    q = preference(prefill, "compute", "bandwidth")
    assert 0 < q.share_of_kernels < 1 and 0 < q.share_of_time < 1


def test_calibration_picks_the_pair_closest_to_l40s_and_a100():
    rows = Calibration.load(HERE / "calibration_sweep.json").rows  # the older, unversioned shape
    choice = pick_pair(rows, *targets("l40s", "a100-sxm-80gb"))
    assert (choice.compute["sms"], choice.compute["hog_sms"], choice.bandwidth["sms"]) == (56, 64, 32)
    assert abs(choice.gemm_ratio / choice.target_gemm_ratio - 1) < 0.05
    assert choice.bandwidth_ratio < choice.target_bandwidth_ratio  # the emulated pair is less complementary


def test_ptx_tells_fused_pointwise_kernels_from_attention():
    _, program, _ = load("llama-decode-compiled")
    fused = [x for x in program.launches if x.name.startswith("triton_poi_fused__scaled_dot_product")]
    # the name says attention; the PTX has no tensor-core instruction: it feeds the attention op
    assert fused and all(kernel_kind(x) == "memory-bound" for x in fused)
    assert all(kernel_kind(x) == "tensor-core" for x in program.launches if x.name.startswith("nvjet"))


def test_transformers_llama_capture_matches_its_config():
    """The transformers-built Llama (workloads.steps.hf_llama): one weight buffer per parameter
    tensor, and the GEMMs' recorded FLOPs equal 2 x tokens x the linear layers' weights."""
    from kernelfleet.workloads.steps import hf_llama

    config = hf_llama(device="meta").module.config
    raw, program, _ = load("hf-llama-prefill")
    numbers = census(program, dependencies(program))
    layers, hidden, ffn = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    kv = hidden // config.num_attention_heads * config.num_key_value_heads
    assert numbers["buffer_roles"]["weight"] == 9 * layers + 3  # + embedding, final norm, head
    tokens = 2 * 64
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn
    expected = 2 * tokens * (layers * per_layer + hidden * config.vocab_size)
    assert sum(op.flops for op in raw.ops if op.name == "aten.mm.default") == expected
    _, fused, _ = load("hf-llama-prefill-compiled")
    compiled = census(fused, dependencies(fused))
    assert compiled["kinds"]["tensor-core"] == numbers["kinds"]["tensor-core"]  # the same GEMMs, under Inductor


def test_a_plan_that_splits_an_op_copies_what_its_kernels_pass_each_other():
    """topk on the H200 is gatherTopK (candidates into the outputs) then bitonicSortKV (sorts them
    in place): a plan putting the two on different devices must copy the candidates. Missing that
    copy is what a random MoE plan hit on the GPU (an index out of bounds in the next gather)."""
    from kernelfleet.plan.transfers import transfers

    raw, program, _ = load("moe-decode")
    topk = next(op for op in raw.ops if op.name == "aten.topk.default" and op.end - op.first == 2)
    gather, sort = program.launches[topk.first], program.launches[topk.first + 1]
    assert "gatherTopK" in gather.name and "bitonicSort" in sort.name
    outputs = {(a.buffer, a.offset_bytes) for a in gather.accesses if a.writes}
    assert outputs and outputs <= {(a.buffer, a.offset_bytes) for a in sort.accesses if a.reads}
    assignment = ["A"] * len(program.launches)
    assignment[sort.index] = "B"
    moved = [t for t in transfers(program, assignment, "A") if t.reader == sort.index]
    assert {(t.buffer, t.offset_bytes) for t in moved if t.writer == gather.index} == outputs
