"""The 8B served through kernelfleet's plans on an H100 (2026-12-06; ``bash bench/pending_run.sh
serve``, docs/validation/serve-gpu.md, sixth run): the benchmark's report read back, its plans row
computed again from the servers' loads."""

from pathlib import Path

import pytest

from bench.serve_gpu import PLANNED, Report, plans_rows

pytestmark = pytest.mark.replay

RECORDED = Path(__file__).parents[2] / "docs" / "validation" / "h100-2026-12-06" / "serve_gpu_plans.json"


def report() -> Report:
    return Report.model_validate_json(RECORDED.read_text())


def test_the_run_served_every_planned_server_on_an_h100():
    run = report()
    assert run.device.startswith("NVIDIA H100") and "--cases plans" in run.command
    assert [c.name for c in run.cases] == list(PLANNED)
    assert all(c.slots == 8 and c.context_tokens == 2048 for c in run.cases)


def test_every_server_answered_the_same_requests_in_full():
    """Same seeded prompts and output lengths: each load's output tokens agree across the servers."""
    cases = report().cases
    for k in range(len(cases[0].poisson)):
        assert len({c.poisson[k].output_tokens for c in cases}) == 1
    assert len({c.trace.output_tokens for c in cases}) == 1


def test_the_plans_row_is_what_the_loads_give(capsys):
    run = report()
    (row,) = plans_rows(run.cases, [(0, 8)])
    assert row.model_dump() == run.plans[0].model_dump()
    assert row.plans_vs_home_alone == pytest.approx(218.85 / 214.17, abs=1e-3)
    assert row.plans_vs_whole_gpu == pytest.approx(218.85 / 297.35, abs=1e-3)
    assert "plans / home partition alone: 1.02x; plans / the whole GPU: 0.74x" in capsys.readouterr().out
