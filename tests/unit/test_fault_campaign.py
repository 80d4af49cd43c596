"""``python -m bench.fault_campaign --quick`` as CI runs it: it finishes, prints its table and the
command, and its last line is JSON whose hard invariants hold — no traceback anywhere, no window
lost to a kill, no corrupt store, the agent alive through readers and a hostile exporter, bad
scraped values kept out, a vanished GPU gone. Speed is the benchmark's to report, not checked here
(the windows the readers cost are only checked to be counted)."""

import pytest
from recorded import bench_quick

pytestmark = pytest.mark.unit
PHASES = {"good", "drip", "huge", "truncated", "duplicate", "range", "bogus", "leave"}


@pytest.fixture(scope="module")
def quick() -> tuple[str, dict]:
    return bench_quick("fault_campaign")


def test_the_table_names_its_command_and_sets_each_figure_beside_the_issues(quick):
    table, figures = quick
    assert f"command: {figures['command']}" in table and figures["command"].endswith("-m bench.fault_campaign --quick")
    assert set(figures) >= {"kills", "readers", "scrape", "fuzz", "tracebacks", "max_rss_bytes", "agent_alive",
                            "store_opens"}
    for earlier in ("0 lost in 20 kills", "8 of 30 windows", "sampling blocked 41 s", "873 MB RSS"):
        assert earlier in table
    assert "FAIL" not in table, table


def test_nothing_raised_a_traceback_and_the_agent_lived(quick):
    _, figures = quick
    assert figures["tracebacks"] == 0 and figures["agent_alive"] and figures["store_opens"]
    fuzz = figures["fuzz"]
    assert fuzz["tests"] > 0 and fuzz["failed"] == 0 and fuzz["recording_tracebacks"] == 0
    for name, case in fuzz["recordings"].items():  # each hostile recording: one line, a non-zero exit
        assert case["rc"] != 0 and case["error"].startswith("kernelfleet: error: "), name


def test_kills_lose_no_acknowledged_window_and_leave_a_sound_store(quick):
    _, figures = quick
    kills = figures["kills"]
    assert kills["tries"] == 4 and kills["windows_acknowledged"] > 0
    assert kills["windows_lost"] == kills["corrupt_stores"] == kills["rollup_buckets_inconsistent"] == 0


def test_readers_are_served_while_the_sampler_counts_its_windows(quick):
    _, figures = quick
    phases = figures["readers"]["phases"]
    assert [p["readers"] for p in phases] == [0, 3]
    assert phases[1]["requests"] > 0 and phases[1]["request_errors"] == 0
    for p in phases:
        assert p["windows_taken"] > 0 and p["windows_missed"] == max(0, p["windows_due"] - p["windows_taken"])


def test_a_hostile_exporter_never_stops_sampling_nor_reaches_the_store(quick):
    _, figures = quick
    scrape = figures["scrape"]
    assert set(scrape["phases"]) == PHASES and all(p["alive"] for p in scrape["phases"].values())
    assert scrape["bad_values_stored"] == 0 and scrape["gpus_max"] == 2
    assert all(p["negative_ofu_lines"] == 0 for p in scrape["phases"].values())
    assert {"duplicate", "out of range"} <= set(scrape["rejections_logged"])
    assert scrape["phases"]["leave"]["gpus"] == 1  # the GPU that left expired after --expire
    # not before --expire (less the window it may have last been seen in before the phase began);
    # the agent's first window past it forgets the GPU, late on a loaded machine: the phase waits
    assert scrape["expire_seconds"] - 1 <= scrape["gone_after_seconds"] < 60
    assert scrape["phases"]["huge"]["rss_bytes"] < 300 * 1024 * 1024  # the 16 MiB cap, not the 50 MB body
