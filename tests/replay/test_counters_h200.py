"""Counter groups of the programs captured on the H200, and the cost tables against measured graphs.

The groups are what ``bench/profile_counters.sh`` profiles (one launch each per profile); the
comparison is ``python3 -m kernelfleet.profile.graphtime`` on the committed warm tables
(tests/data/h200-capture/*.profile.json) and single-device graph times (tests/data/h200x2-disagg).
When the counters run comes back, its CSV and groups file join these fixtures.
"""

import json
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.profile.graphtime import ADJUSTED, graph_checks, load_checks, per_slot
from kernelfleet.profile.groups import Groups, by_weight, group_launches, signature

pytestmark = pytest.mark.replay

DATA = Path(__file__).parents[1] / "data"
CAPTURES = DATA / "h200-capture"
MEASURED = DATA / "h200x2-disagg"
STEPS = {"llama8b-decode": 50, "llama8b-prefill": 51, "dit-h200-denoise": 35, "vlm7b-prefill": 69,
         "mamba7b-decode": 48, "moe20b-decode": 84}


def program_and_seconds(step):
    program = assemble(RawCapture.load(CAPTURES / f"{step}.profiled-capture.json.gz"))
    profiles = json.loads((CAPTURES / f"{step}.profile.json").read_text())["profiles"]
    return program, {name: p["seconds"] for name, p in profiles.items()}


def misplaced(groups, seconds):
    """Share of the step's time a group's first launch, counted once per member, gets wrong."""
    return sum(abs(len(g) * seconds[g[0]] - sum(seconds[i] for i in g)) for g in groups) / sum(seconds)


@pytest.mark.parametrize("step, expected", STEPS.items())
def test_groups_are_few_cover_every_launch_once_and_stand_for_their_members(step, expected):
    program, seconds = program_and_seconds(step)
    groups = group_launches(program)
    assert len(groups) == expected and len(groups) * 15 < len(program.launches)  # DiT: 625 in 35
    members = sorted(i for g in groups for i in g.launches)
    assert members == list(range(len(program.launches)))  # every launch in exactly one group
    for g in groups:
        assert {signature(program.launches[i]) for i in g.launches} == {signature(program.launches[g.representative])}
        assert g.representative == min(g.launches)
    for profile in ("compute", "bandwidth"):
        assert misplaced([g.launches for g in groups], seconds[profile]) < 0.02


@pytest.mark.parametrize("step", ["llama8b-prefill", "dit-h200-denoise", "vlm7b-prefill"])
def test_without_the_access_sizes_persistent_gemms_of_different_shapes_would_share_a_group(step):
    program, seconds = program_and_seconds(step)
    coarse: dict = {}
    for launch in program.launches:
        coarse.setdefault(signature(launch)[:5], []).append(launch.index)
    assert misplaced(list(coarse.values()), seconds["compute"]) > 0.15


def test_groups_file_checks_the_program_it_is_joined_to():
    decode, seconds = program_and_seconds("llama8b-decode")
    groups = Groups("llama8b-decode", len(decode.launches), group_launches(decode))
    Groups.from_json(groups.to_json()).check_program(decode)
    prefill, _ = program_and_seconds("llama8b-prefill")
    with pytest.raises(UsageError, match="1975 launches, this one has 1782"):
        groups.check_program(prefill)
    heaviest = by_weight(groups.groups, seconds["whole"])
    weights = [sum(seconds["whole"][i] for i in g.launches) for g in heaviest]
    assert weights == sorted(weights, reverse=True)
    assert [len(g.launches) for g in by_weight(groups.groups, seconds["whole"][:10])] == sorted(
        (len(g.launches) for g in groups.groups), reverse=True)  # seconds of another capture: by launches


def test_warm_tables_against_measured_single_device_graphs():
    rows = {(r.step, r.profile, r.table): r for r in load_checks(CAPTURES, MEASURED)}
    assert {r[2] for r in rows} == {"warm"}  # no cold-L2 table recorded yet
    prefill = rows["llama8b-prefill", "compute", "warm"]
    assert prefill.table_seconds == pytest.approx(0.13223, abs=1e-5)
    assert prefill.measured_seconds == pytest.approx(0.50185 / 3, abs=1e-5)
    assert prefill.error_ratio == pytest.approx(-0.21, abs=0.01)
    assert rows["llama8b-prefill", "bandwidth", "warm"].error_ratio == pytest.approx(-0.27, abs=0.01)
    assert rows["vlm7b-prefill", "bandwidth", "warm"].error_ratio == pytest.approx(-0.25, abs=0.01)
    assert rows["dit-h200-denoise", "compute", "warm"].measured_over_table == pytest.approx(3.02, abs=0.01)
    for profile in ("compute", "bandwidth"):  # decode steps: the tables hold to within 10 %
        for step in ("llama8b-decode", "moe20b-decode", "mamba7b-decode"):
            assert abs(rows[step, profile, "warm"].error_ratio) <= 0.10
    assert rows["llama8b-decode", "whole", "warm"].measured_seconds is None  # no single run of the whole GPU


def test_a_cold_table_with_its_warm_single_control():
    warm = json.loads((CAPTURES / "llama8b-prefill.profile.json").read_text())
    disagg = json.loads((MEASURED / "llama8b-prefill.disagg.json").read_text())
    base = warm["profiles"]["compute"]["seconds"]
    cold = {"profiles": {"compute": {"seconds": [1.5 * s for s in base], "warm_single_seconds": [1.2 * s for s in base]}}}
    rows = {r.table: r for r in graph_checks("llama8b-prefill", {"warm": warm, "cold-l2": cold}, disagg)
            if r.profile == "compute"}
    assert rows["cold-l2"].table_seconds == pytest.approx(1.5 * sum(base))
    assert rows[ADJUSTED].table_seconds == pytest.approx(1.3 * sum(base))  # warm + (cold - warm single)
    assert rows[ADJUSTED].measured_seconds == per_slot(disagg, "compute")
    cold["profiles"]["compute"]["warm_single_seconds"] = base[:-1]
    with pytest.raises(UsageError, match="different launch counts"):
        graph_checks("llama8b-prefill", {"warm": warm, "cold-l2": cold}, disagg)


def test_cold_tables_are_read_from_their_own_folder(tmp_path):
    warm = json.loads((CAPTURES / "llama8b-decode.profile.json").read_text())
    for profile in warm["profiles"].values():
        profile["warm_single_seconds"] = profile["seconds"]
        profile["seconds"] = [2 * s for s in profile["seconds"]]
    (tmp_path / "llama8b-decode.cold-l2.profile.json").write_text(json.dumps(warm))
    rows = {(r.step, r.profile, r.table): r for r in load_checks(CAPTURES, MEASURED, tmp_path)}
    decode = rows["llama8b-decode", "compute", "cold-l2"]
    assert decode.table_seconds == pytest.approx(2 * rows["llama8b-decode", "compute", "warm"].table_seconds)
    assert rows["llama8b-decode", "compute", ADJUSTED].table_seconds == pytest.approx(decode.table_seconds)
    assert ("llama8b-prefill", "compute", "cold-l2") not in rows
