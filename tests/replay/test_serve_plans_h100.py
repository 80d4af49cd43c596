"""The 8B and the MoE served through kernelfleet's plans on an H100 (2026-12-06,
docs/validation/serve-gpu.md, sixth and seventh runs): each benchmark report read back, its plans
row computed again from the servers' loads.

* ``serve_gpu_plans.json``: the 8B's plans made on an H200 for many requests in flight, served on
  an H100, 8 requests a rate (``bash bench/pending_run.sh serve``, the sixth run);
* ``serve_gpu_plans_8b_made.json``, ``serve_gpu_plans_moe_made.json``: plans made on the H100 that
  serves them, for one request in flight, then served, 8 requests a rate (``pending_run.sh serve``,
  ``serve-moe``);
* ``serve_gpu_plans_8b_32.json``, ``serve_gpu_plans_moe_32.json``: the same plans served again, 32
  requests a rate and a trace of 64 (``PENDING_REQUESTS=32 bash bench/pending_run.sh serve-moe
  serve``).
"""

from pathlib import Path

import pytest

from bench.serve_gpu import PLANNED, Report, plans_rows

pytestmark = pytest.mark.replay

RECORDED = Path(__file__).parents[2] / "docs" / "validation" / "h100-2026-12-06"
# report -> (model, requests a rate, plans / home partition alone, plans / the whole GPU), as printed
RUNS = {"serve_gpu_plans.json": ("llama8b", 8, "1.02x", "0.74x"),
        "serve_gpu_plans_8b_made.json": ("llama8b", 8, "1.02x", "0.80x"),
        "serve_gpu_plans_moe_made.json": ("moe", 8, "1.00x", "0.90x"),
        "serve_gpu_plans_8b_32.json": ("llama8b", 32, "0.99x", "0.81x"),
        "serve_gpu_plans_moe_32.json": ("moe", 32, "1.03x", "0.93x")}


def report(name: str) -> Report:
    return Report.model_validate_json((RECORDED / name).read_text())


@pytest.mark.parametrize("name", RUNS)
def test_every_planned_server_ran_on_an_h100(name):
    run = report(name)
    model, requests, _, _ = RUNS[name]
    assert run.device.startswith("NVIDIA H100") and "--cases plans" in run.command
    assert ("--plans-model moe" in run.command) == (model == "moe")
    assert [c.name for c in run.cases] == list(PLANNED)
    assert all(c.slots == 8 and c.context_tokens == 2048 for c in run.cases)
    assert all(load.requests == requests for c in run.cases for load in c.poisson)


@pytest.mark.parametrize("name", RUNS)
def test_every_server_answered_the_same_requests_in_full(name):
    """Same seeded prompts and output lengths: each load's output tokens agree across the servers."""
    cases = report(name).cases
    for k in range(len(cases[0].poisson)):
        assert len({c.poisson[k].output_tokens for c in cases}) == 1
    assert len({c.trace.output_tokens for c in cases}) == 1


@pytest.mark.parametrize("name", RUNS)
def test_the_plans_row_is_what_the_loads_give(name, capsys):
    run = report(name)
    model, _, home, whole = RUNS[name]
    (row,) = plans_rows(run.cases, [(0, 8)], model)
    assert row.model_dump() == run.plans[0].model_dump()
    assert f"plans / home partition alone: {home}; plans / the whole GPU: {whole}" in capsys.readouterr().out


def test_the_sixth_runs_ratios():
    (row,) = plans_rows(report("serve_gpu_plans.json").cases, [(0, 8)])
    assert row.plans_vs_home_alone == pytest.approx(218.85 / 214.17, abs=1e-3)
    assert row.plans_vs_whole_gpu == pytest.approx(218.85 / 297.35, abs=1e-3)


@pytest.mark.parametrize("name", [name for name, (_, requests, _, _) in RUNS.items() if requests == 32])
def test_under_32_requests_a_rate_the_monitor_gave_steps_to_both_plans(name):
    """Every placed server's loads record the steps each plan ran (``plan_steps``); with 32 requests
    a rate on 8 slots requests queued, and the monitor ran both plans under every load."""
    for case in report(name).cases[1:]:
        for load in [*case.poisson, case.trace]:
            assert load.plan_steps and load.plan_steps["latency"] > 0 and load.plan_steps["throughput"] > 0
