"""``python -m bench.edge_cost`` on one GPU (the same-kernel pair a:64, b:32 of bench.place_pairs):
the step profiled, every plan of the edge experiment gated bit for bit and timed, each plan that
copies with a zero-byte twin timed and never gated, and the file it writes fits on the CPU
(``bench.place_table --edges``). Carves partitions: named to run with the other partition tests, last."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_the_edge_experiment_gates_times_and_records_every_plan(tmp_path, capsys):
    from bench import edge_cost, place_table
    from kernelfleet.plan.edgerun import EdgeRun

    assert edge_cost.main(["--out", str(tmp_path), "--targets", "dit-denoise", "--repeats", "5"]) == 0
    run = EdgeRun.load(tmp_path / "edges.json")
    print(capsys.readouterr().out)
    full = [p for p in run.plans if p.copy_cap_bytes is None]
    twins = [p for p in run.plans if p.copy_cap_bytes is not None]
    assert run.refused == [] and not run.derived and len(full) == 14
    assert all(p.gate == "identical" and p.measured_seconds for p in full), [(p.name, p.gate) for p in full]
    assert {p.name.split(", copies")[0] for p in twins} == {p.name for p in full if p.counts.copies}
    assert all(p.measured_seconds and p.gate.startswith("not gated") and p.counts.copy_bytes <= 4 * p.counts.copies
               for p in twins)
    assert place_table.main(["--edges", str(tmp_path / "edges.json"), "--fit-out", str(tmp_path / "fit.json")]) == 0
    assert "the fit comes from the 14 timed plans" in capsys.readouterr().out
