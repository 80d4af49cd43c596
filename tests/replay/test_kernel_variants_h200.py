"""One transformers step captured on an H200 with different kernels for the same ops
(``python -m bench.record_kernel_variants``: SDPA's default backend, cuDNN attention, against its math
composition; flash attention has no kernel for this masked shape). What the place half's op
matching and its gate for different kernels will stand on, as recorded:

* outside attention the two captures record the same ATen ops in the same order; each attention
  is one op in the default capture (``_scaled_dot_product_cudnn_attention``) and a run of thirteen
  in the math one (matmuls, scaling, ``_safe_softmax``): a matcher must take that run as one unit;
* the logits agree to a cosine of 0.99997 and differ in argmax at one position of 128, where the
  reference's top-2 margin is one bf16 step (0.0039): the near-tie the gate must allow.
"""

import difflib
import json
from pathlib import Path

import pytest
import torch

from bench.record_kernel_variants import compare
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture

pytestmark = pytest.mark.replay

DATA = Path(__file__).parents[1] / "data" / "h200-variants"
RECORDED = json.loads((DATA / "variants.json").read_text())["variants"]


@pytest.fixture(scope="module")
def captures() -> dict[str, RawCapture]:
    return {name: RawCapture.load(DATA / f"{name}.capture.json.gz") for name in ("default", "math")}


def test_each_variant_assembles_to_the_launches_it_recorded(captures):
    for name, raw in captures.items():
        program = assemble(raw)
        assert (len(program.launches), len(raw.ops)) == (RECORDED[name]["launches"], RECORDED[name]["ops"])
    assert (RECORDED["default"]["launches"], RECORDED["math"]["launches"]) == (133, 163)
    assert "refused" in RECORDED["flash"]


def test_the_ops_match_outside_attention_and_each_attention_is_one_op_against_a_run(captures):
    default, math = ([op.name for op in captures[n].ops] for n in ("default", "math"))
    blocks = difflib.SequenceMatcher(a=default, b=math, autojunk=False).get_opcodes()
    differing = [b for b in blocks if b[0] != "equal"]
    assert [b[0] for b in differing] == ["replace", "replace"]  # one per layer, nothing else moved
    for _, a0, a1, b0, b1 in differing:
        assert default[a0:a1] == ["aten._scaled_dot_product_cudnn_attention.default"]
        run = math[b0:b1]
        assert len(run) == 13 and "aten._safe_softmax.default" in run and run.count("aten.bmm.default") == 2
    same = sum(b[2] - b[1] for b in blocks if b[0] == "equal")
    assert same == len(default) - 2 == 124


def test_the_logits_agree_but_for_a_near_tie_as_recorded():
    logits = torch.load(DATA / "logits.pt")
    found = compare(logits["default"], logits["math"])
    assert found == RECORDED["math"]["against_default"]  # derived again from the recorded logits
    assert found["min_cosine"] >= 0.999 and found["argmax_agreement"] < 1.0
    assert found["argmax_differs_at"] == 1 and max(found["reference_margin_where_argmax_differs"]) <= 2 ** -8


def test_the_tolerance_gate_passes_the_other_kernels_and_refuses_a_local_fault():
    from kernelfleet.runtime.gate import agreement

    logits = torch.load(DATA / "logits.pt")
    reference, math = logits["default"].float(), logits["math"].float()
    found = agreement(reference, math)
    assert found.passed and str(found).startswith("within tolerance")
    assert found.argmax_differs_at == 1 and found.near_tie_bound == pytest.approx(2 * 0.0078125, abs=2e-3)
    # at a position of median margin (0.07), its top logit pushed one bf16 step below its runner-up: a
    # flip no rounding explains
    rows = reference.flatten(0, -2)
    top2 = rows.topk(2, -1)
    margins = top2.values[:, 0] - top2.values[:, 1]
    position = int(margins.argsort()[len(margins) // 2])
    faulty = math.flatten(0, -2).clone()
    faulty[position, top2.indices[position, 0]] = top2.values[position, 1] - 2 ** -8
    local = agreement(reference, faulty.view_as(math))
    assert local.min_cosine >= 0.999 and not local.passed  # the cosine alone would let it through
    assert str(local).startswith("outside tolerance")
    # noise on every logit: the cosine refuses it
    noisy = agreement(reference, math + torch.randn(math.shape, generator=torch.Generator().manual_seed(0)) * 0.2)
    assert noisy.min_cosine < 0.999 and not noisy.passed


def test_the_servers_gate_passes_the_math_logits_within_tolerance_and_refuses_a_wrong_row():
    """What ``kernelfleet serve --plans`` asks of a plan graph whose devices run different kernels
    (serve/placed_build.py): the same logits bit for bit, or the tolerance over its one step."""
    from kernelfleet.runtime.gate import IDENTICAL, passed, single_step_verdict

    logits = torch.load(DATA / "logits.pt")
    reference, other = logits["default"], logits["math"]
    assert single_step_verdict([reference], [reference.clone()], units=True) == IDENTICAL
    said = single_step_verdict([reference], [other], units=True)
    assert passed(said) and said.startswith("within tolerance: min cosine 0.9999") and "1 of 128 positions" in said
    assert not passed(single_step_verdict([reference], [other], units=False))  # the same kernels: bit for bit
    wrong = other.clone()
    wrong.reshape(-1, wrong.shape[-1])[5] = wrong.reshape(-1, wrong.shape[-1])[5].flip(-1)  # one row's logits garbled
    said = single_step_verdict([reference], [wrong], units=True)
    assert not passed(said) and said.startswith("outside tolerance: min cosine")
