"""Two batches in flight for the placed server, measured before building them, and the MoE under
every server strategy: one H100, 2026-12-06 (docs/validation/serve-gpu.md, eighth run).

* ``tests/data/h100-serve-two``: the 8B's bucket-4 step (8 slots of 2,048 tokens) planned
  ``--in-flight 2`` and run by ``bench disagg --slots 2`` (two half batches of bucket 8 in one graph),
  in two calls (``disagg_first.json``, then ``disagg.json``); in the second call's process after it,
  ``kernelfleet profile`` of the bucket-8 step with ``--graph-copies 1`` (``costs_b8.json``);
* ``program_b8.json.gz``: that step's program, as the seventh run's plans for bucket 8 carry it
  (made on the same H100 image from the same step: 8 slots of 2,048 tokens, batch 8);
* ``docs/validation/h100-2026-12-06/serve_gpu_moe_strategies.json``: ``bench.serve_gpu --cases
  moe-strategies --requests 12``, its H200 caps scaled to the H100.
"""

import json
from pathlib import Path

import pytest

from bench.serve_gpu import Report, held_tokens_per_second
from kernelfleet.costs.table import CostTable
from kernelfleet.kernels.ir import Program

pytestmark = pytest.mark.replay

ROOT = Path(__file__).parents[2]
TWO = ROOT / "tests" / "data" / "h100-serve-two"
MOE = ROOT / "docs" / "validation" / "h100-2026-12-06" / "serve_gpu_moe_strategies.json"
RUNS = ("disagg_first.json", "disagg.json")


def strategies(name: str) -> dict:
    return json.loads((TWO / name).read_text())["strategies"]


def costs(bucket: int) -> CostTable:
    path = TWO / f"costs_b{bucket}.json"
    return CostTable.from_json(path.read_text(), str(path))


def test_it_ran_on_an_h100_over_the_servers_own_step():
    assert (TWO / "smi.txt").read_text().splitlines()[1].startswith("NVIDIA H100 80GB HBM3")
    for name in RUNS:
        run = json.loads((TWO / name).read_text())
        assert "serve-decode,batch=4,slots=8,context=2048" in run["command"] and run["slots"] == 2
        assert {d: spec["sms"] for d, spec in run["devices"].items()} == {"a": 64, "b": 56}
    for bucket in (4, 8):
        assert "NVIDIA H100 80GB HBM3" in costs(bucket).source


@pytest.mark.parametrize("name", RUNS)
def test_every_strategy_passed_the_bit_exact_gate_and_request_distribution_ran_fastest(name):
    """Before the gate zeroed outputs in inference mode, every strategy of this step was refused."""
    found = strategies(name)
    assert len(found) == 22 and all(r["gate"] == "identical" for r in found.values())
    fastest = min(found, key=lambda n: found[n]["seconds"] / found[n]["slots"])
    assert fastest.startswith("replicas")
    replicas = found["replicas"]
    assert abs(replicas["seconds"] / replicas["predicted_seconds"] - 1) < 0.005  # 26.67 against 26.78 ms


def test_the_two_calls_agree_within_0_6_percent_on_every_row():
    """Each call planned the step again (its plans' copies differ by one); single:a with free slots
    moved most, 0.50 %."""
    first, second = strategies(RUNS[0]), strategies(RUNS[1])
    assert first.keys() == second.keys()
    assert all(abs(second[n]["seconds"] / first[n]["seconds"] - 1) < 0.006 for n in first)


def test_two_halves_on_the_pair_beat_one_batch_on_a_by_11_percent_and_lose_to_the_whole_gpu():
    """Request distribution of the two halves (26.67 ms for the 8 rows) against the bucket-8 step on a,
    which the placed server runs today (29.69 ms), and on the whole GPU (20.94 ms)."""
    found, b8 = strategies("disagg.json"), costs(8)
    halves = found["replicas"]["seconds"]
    assert round(b8.graph_seconds["a"] / halves, 2) == 1.11
    assert round(b8.graph_seconds["whole"] / halves, 2) == 0.79
    # every other way to run the halves is slower than the one batch on a
    others = [n for n in found if not n.startswith("replicas") and "1 slot" not in n]
    assert min(found[n]["seconds"] for n in others) > b8.graph_seconds["a"]


def test_the_plan_made_for_two_in_flight_runs_29_percent_over_its_free_slot_prediction():
    found = strategies("disagg.json")
    free = found["throughput-milp, slots free"]
    assert free["copies"] == 400 and 0.28 < free["seconds"] / free["predicted_seconds"] - 1 < 0.29
    assert 0.75 < costs(8).graph_seconds["a"] / free["seconds"] < 0.76


def test_one_copy_a_profile_times_alone_and_shared_and_skips_the_free_graph():
    b4, b8 = costs(4), costs(8)
    assert b4.graph_seconds_free and set(b4.graph_seconds_free) == {"a", "b", "whole"}
    assert not b8.graph_seconds_free and set(b8.graph_seconds_shared) == {"a", "b"}
    log = (TWO / "profile_b8.txt").read_text()
    assert "captured 1 replicas of the step" in log and "free copies" not in log


def test_the_moe_under_every_strategy_holds_64_per_second_and_request_distribution_loses():
    run = Report.model_validate_json(MOE.read_text())
    assert run.device.startswith("NVIDIA H100") and "--cases moe-strategies" in run.command
    cases = {case.name: case for case in run.cases}
    assert list(cases) == ["moe-replicas", "moe-split", "moe-pipeline"]
    # the H200's caps (60 + 60, 30 + 100 GB) scaled to the H100's 85 GB
    assert cases["moe-replicas"].flags[:6] == ["--strategy", "replicas", "--device", "r0:39.5@0", "--device",
                                               "r1:39.5@0"]
    assert cases["moe-split"].flags[:6] == ["--strategy", "split", "--device", "pre:18@0", "--device", "dec:61@0"]
    assert [case.slots for case in cases.values()] == [128, 64, 64]
    assert all(case.max_rate_at_p99_tpot_50ms == 64.0 for case in cases.values())
    held = {name: held_tokens_per_second(case) for name, case in cases.items()}
    assert round(held["moe-replicas"], 1) == 568.8 and round(held["moe-split"], 1) == 886.9
    assert round(held["moe-pipeline"], 1) == 893.3
    assert held["moe-replicas"] < 0.65 * min(held["moe-split"], held["moe-pipeline"])


def test_on_the_h100_image_half_of_the_8b_decode_step_repeats_its_keys_and_values():
    """The image's transformers (before 5.24; the device notes list 5.17) repeated every layer's
    cached keys and values for the query heads in every decode step (``repeat_kv``, with the 4-D mask
    the server passes): 64 copy kernels, each reading one layer's 32 MiB cache of keys or values and
    writing 4x that, took 9.43 of the step's 19.22 ms of launches on the whole GPU. transformers 5.24
    folds the one-token query onto the key/value heads instead; the serve extra now asks for it
    (tests/unit/test_serve_decode_attention.py), and the H200's serve runs after the first had it
    (docs/validation/serve-gpu.md)."""
    program = Program.load(TWO / "program_b8.json.gz")
    table = costs(8)
    assert len(program.launches) == len(table.seconds) == 1624
    buffers = {b.id: b for b in program.buffers}
    repeats = [launch for launch in program.launches if launch.op == "aten.reshape.default"]
    assert len(repeats) == 64
    for launch in repeats:
        read = [buffers[a.buffer] for a in launch.accesses if a.mode == "read"]
        written = [buffers[a.buffer] for a in launch.accesses if a.mode == "write"]
        assert len(read) == 1 and read[0].name.startswith("cache_") and written[0].size_bytes == 4 * read[0].size_bytes
    assert len({buffers[a.buffer].name for launch in repeats for a in launch.accesses if a.mode == "read"}) == 64
    whole = sum(row["whole"] for row in table.seconds)
    repeated = sum(table.seconds[launch.index]["whole"] for launch in repeats)
    assert round(whole * 1e3, 2) == 19.22 and round(repeated * 1e3, 2) == 9.43
