"""The place runs left waiting for a GPU, made on one H100 on 2026-12-06 (``bash bench/pending_run.sh
place``; the card's ``nvidia-smi`` line in tests/data/h100-place-pairs/smi.txt): the link on its two
partitions (tests/data/h100-link), Qwen2-MoE decode's edge plans (tests/data/h100-edges) and the
two same-kernel rows that had missed their prediction on the H200 (tests/data/h100-place-pairs).

* Every edge plan of Qwen2-MoE decode ran and passed the bit-exact gate. On the H200 (2026-12-02)
  those plans faulted the GPU: an ``aten.sort`` split across the devices read its workspace's
  pointer words stale. Since 2026-12-05 such op calls stay whole (tests/replay/test_sort_workspace_h200.py),
  and here plans that put the sorts on b and their inputs' writers on a ran right.
* Both rows meet the targets: every chained plan within 10 % of its prediction and the choice
  within 3 % of the best. hf-mamba-decode's pipeline, 15.6 % faster than predicted on the H200, is
  within 3 % here (docs/validation/place-h200-pairs.md says what that does and does not settle).
"""

import json
from pathlib import Path

import pytest

from bench import place_table
from kernelfleet.kernels.ir import Program
from kernelfleet.plan.edgerun import EdgeRun, edge_plans
from kernelfleet.plan.transfers import transfers

pytestmark = pytest.mark.replay

DATA = Path(__file__).parents[1] / "data"
PAIRS = DATA / "h100-place-pairs"
EDGES = DATA / "h100-edges"
FOLDERS = sorted(p.parent for p in PAIRS.glob("*/disagg.json"))


def test_the_runs_were_made_on_an_h100():
    assert (PAIRS / "smi.txt").read_text().splitlines()[1].startswith("NVIDIA H100 80GB HBM3")
    run = EdgeRun.load(EDGES / "edges.json")
    assert "NVIDIA H100 80GB HBM3" in run.source and not run.derived
    link = json.loads((DATA / "h100-link" / "links.json").read_text())
    assert "NVIDIA H100 80GB HBM3" in json.dumps(link)


def test_every_qwen2moe_decode_edge_plan_ran_and_passed_the_bit_exact_gate():
    run = EdgeRun.load(EDGES / "edges.json")
    program = Program.load(EDGES / "hf-qwen2moe-decode" / "program.json.gz")
    made = edge_plans(program, "a", "b")
    assert run.refused == [] and sorted(p.name for p in run.plans) == sorted(name for name, _, _ in made)
    assert all(p.gate == "identical" and p.measured_seconds for p in run.plans)
    # as the plan that faulted on the H200 did, plans here copied what a sort reads from the other device
    sorts = {launch.index for launch in program.launches if launch.op == "aten.sort.default"}
    assert len(sorts) == 10  # two calls of five launches each
    fed = [name for name, _, assignment in made
           if any(t.reader in sorts for t in transfers(program, assignment, "a", True))]
    assert len(fed) >= 4, fed  # 6 of the 14


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_both_rows_meet_the_placement_targets(folder):
    row = place_table.row_of(folder)
    assert row.chosen_over_best <= 1 + place_table.CHOSEN_WITHIN
    assert row.predictions_within == row.predictions >= 6
    assert row.gates == "identical"


def test_a_latency_plan_on_one_device_is_read_as_that_devices_own_run():
    """Both rows' latency plan places every launch on a: the table reads single:a's own run (the
    same graph, timed twice, differs by noise), so Qwen2-MoE, where a was the faster device alone,
    meets the target exactly, and Mamba, where b was (by 0.16 %, against the profile's ranking),
    misses it by that much."""
    for name in ("hf-mamba-decode.same", "hf-qwen2moe-decode.same"):
        assert place_table.timed_as(PAIRS / name, "latency-greedy") == "single:a"
    found = {name: json.loads((PAIRS / f"{name}.same" / "disagg.json").read_text())["strategies"]
             for name in ("hf-mamba-decode", "hf-qwen2moe-decode")}
    assert place_table.row_of(PAIRS / "hf-qwen2moe-decode.same").latency_over_single == 1.0
    mamba = found["hf-mamba-decode"]
    ratio = mamba["single:a"]["seconds"] / mamba["single:b"]["seconds"]
    assert ratio > 1.001 and place_table.row_of(PAIRS / "hf-mamba-decode.same").latency_over_single == ratio


def test_mamba_decodes_pipeline_is_within_its_prediction_on_the_h100():
    found = json.loads((PAIRS / "hf-mamba-decode.same" / "disagg.json").read_text())["strategies"]["pipeline"]
    assert abs(found["seconds"] / found["predicted_seconds"] - 1) < 0.03
