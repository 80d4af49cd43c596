"""Which memsets the profiler replays before a kernel (``kernels/cuda/replay.py: preludes``), on the
H200 captures: the stream-K GEMMs and cuDNN attention of the prefill-like steps, whose per-kernel
times are impossible without them, and plausible with them."""

import json
from collections import Counter
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.replay import preludes
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan import command
from kernelfleet.profile.table import cost_table

pytestmark = pytest.mark.unit

HERE = Path(__file__).parents[1] / "data" / "h200-capture"
H200_BF16_PEAK = 989.4e12


def program(step: str):
    return assemble(RawCapture.load(HERE / f"{step}.profiled-capture.json.gz"))


@pytest.mark.parametrize("step,kernels", [("llama8b-prefill", 97), ("dit-h200-denoise", 121), ("vlm7b-prefill", 149),
                                          ("llama8b-decode", 1)])
def test_every_memset_resets_the_kernel_of_its_op_call_after_it(step, kernels):
    prog = program(step)
    found = preludes(prog)
    assert len(found) == kernels
    memsets = [m for resets in found.values() for m in resets]
    assert sorted(memsets) == [x.index for x in prog.launches if x.kind == "memset"]  # each resets one kernel
    for kernel, resets in found.items():
        assert prog.launches[kernel].kind == "kernel"
        assert all(m < kernel and prog.launches[m].op_index == prog.launches[kernel].op_index for m in resets)


def test_the_reset_kernels_are_stream_k_gemms_and_cudnn_attention():
    prog = program("llama8b-prefill")
    names = Counter(prog.launches[k].name.split("_kernel")[0][:40] for k in preludes(prog))
    assert names.most_common(2) == [("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coo", 64),
                                    ("cudnn_generated_fort_native_sdpa_sm90_fl", 32)]


def op_rates(step: str, seconds: list) -> tuple[list[float], list[float]]:
    """FLOP/s of each op call over 1 GFLOP from ``seconds`` (one per launch): (those of the op calls
    whose kernel a memset resets, every other)."""
    raw = RawCapture.load(HERE / f"{step}.profiled-capture.json.gz")
    prog = assemble(raw)
    assert len(seconds) == len(prog.launches)
    reset_ops = {prog.launches[k].op_index for k in preludes(prog)}
    by_op: dict[int, float] = {}
    for launch in prog.launches:
        if launch.op_index is not None:
            by_op[launch.op_index] = by_op.get(launch.op_index, 0.0) + (seconds[launch.index] or 0.0)
    rate = {op: raw.ops[op].flops / t for op, t in by_op.items() if raw.ops[op].flops > 1e9 and t > 0}
    return [r for op, r in rate.items() if op in reset_ops], [r for op, r in rate.items() if op not in reset_ops]


def before_and_after(step: str) -> tuple[list, list]:
    """Whole-GPU seconds per launch timed without the memsets (the cold-L2 run's one-copy, warm
    column, recorded before preludes existed) and with them (the committed table, timed since)."""
    before = json.loads((HERE / f"{step}.cold-l2.profile.json").read_text())["profiles"]["whole"]
    after = json.loads((HERE / f"{step}.profile.json").read_text())["profiles"]["whole"]
    return before["warm_single_seconds"], after["seconds"]


@pytest.mark.parametrize("step", ["llama8b-prefill", "dit-h200-denoise"])
def test_without_their_memsets_those_kernels_ran_impossibly_fast_and_with_them_they_do_not(step):
    """Timed alone without their memsets, all but one of these kernels' op calls ran past the H200's
    bf16 peak (to 6,300 and 60,000 TFLOP/s): they skipped their work. Timed with them, every op call
    stays under it, the stream-K GEMMs at the rate of cuBLAS's big GEMMs (about 800 TFLOP/s)."""
    before, after = before_and_after(step)
    reset, other = op_rates(step, before)
    assert len(reset) >= 90 and sum(r > H200_BF16_PEAK for r in reset) == len(reset) - 1
    assert max(other) < H200_BF16_PEAK
    reset, other = op_rates(step, after)
    assert max(reset + other) < 0.85 * H200_BF16_PEAK
    assert max(reset) > 0.75 * H200_BF16_PEAK  # the stream-K GEMMs now do their work at a GEMM's rate


def _costs(step: str, seconds: dict):
    raw = RawCapture.load(HERE / f"{step}.profiled-capture.json.gz")
    prog = assemble(raw)
    return prog, cost_table(raw, prog, seconds, f"test ({step})")


@pytest.mark.parametrize("step,timed,at_least,at_most", [
    ("dit-h200-denoise", "without memsets", 50, 121), ("llama8b-prefill", "without memsets", 20, 97),
    ("dit-h200-denoise", "with memsets", 0, 0), ("llama8b-prefill", "with memsets", 0, 0),
    ("vlm7b-prefill", "with memsets", 0, 0), ("llama8b-decode", "with memsets", 0, 0)])
def test_the_planner_warns_of_times_no_gpu_of_the_catalog_could_reach(step, timed, at_least, at_most, tmp_path):
    """kernelfleet plan's setup flags launches whose time implies more FLOP/s than the fastest
    catalog GPU's dense peak: on tables timed without the memsets, only kernels that had one to
    miss; on the tables timed with them, none."""
    table = "cold-l2.profile.json" if timed == "without memsets" else "profile.json"
    column = "warm_single_seconds" if timed == "without memsets" else "seconds"
    profiles = json.loads((HERE / f"{step}.{table}").read_text())["profiles"]
    prog, costs = _costs(step, {name: p[column] for name, p in profiles.items() if name != "whole"})
    (tmp_path / "p.json").write_text(prog.to_json())
    (tmp_path / "c.json").write_text(costs.to_json())
    done = command.setup(tmp_path / "p.json", tmp_path / "c.json", [], [], 25.0, [], [], None)
    warnings = [n for n in done.notes if n.startswith("warning:")]
    skus = list(Catalog.load(None))
    ceiling = {"bf16": max(s.peak_flops("bf16") for s in skus if s.peak_flops("bf16"))}
    flagged = {k for k, _, _ in costs.faster_than(ceiling)}
    assert at_least <= len(flagged) <= at_most
    assert flagged <= set(preludes(prog))
    assert len(warnings) == (1 if flagged else 0)
    if flagged:
        assert f"warning: {len(flagged)} launches" in warnings[0]


def test_a_kernel_accumulating_onto_a_fill_is_replayed_after_the_fill():
    """The reference MoE decode step scatters routing weights into fresh zeros: replayed alone again
    and again it would scatter onto its own last result, so its fill goes first (and pow of a scalar
    base, which computes in place over a fill). Nothing else gains a prelude: a split-K reduction
    after its GEMM recomputes its bytes on every replay."""
    from kernelfleet.kernels.cuda.replay import FILL_KERNEL, refills, replay_preludes

    prog = assemble(RawCapture.load(HERE / "moe-decode.capture.json.gz"))
    found = refills(prog)
    memsets = preludes(prog)
    new = {k: [w for w in v if w not in memsets.get(k, [])] for k, v in found.items()}
    new = {k: v for k, v in new.items() if v}
    assert {prog.launches[k].op for k in new} == {"aten.scatter_.value", "aten.scatter_.src", "aten.pow.Scalar"}
    assert sum(prog.launches[k].op.startswith("aten.scatter_") for k in new) == 4  # two per MoE layer
    assert all(FILL_KERNEL in prog.launches[w].name for v in new.values() for w in v)
    merged = replay_preludes(prog)
    assert all(set(v) <= set(merged[k]) for k, v in {**memsets, **found}.items())
    decode = assemble(RawCapture.load(HERE / "llama8b-decode.capture.json.gz"))
    gained = {k for k, v in replay_preludes(decode).items() if v != preludes(decode).get(k)}
    assert {decode.launches[k].op for k in gained} == {"aten.pow.Scalar"}  # not its 160 split-K reductions
