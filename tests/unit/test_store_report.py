"""A job's report adds its parts (closed hours, the rolled minutes of the open hour, the open
minute from raw rows) into what the windows themselves say: per GPU, per class, per hour, per minute."""

import math

import pytest

from kernelfleet.fleet.store import GpuRow, JobRow, Store
from kernelfleet.fleet.store_schema import BOTTLENECKS

pytestmark = pytest.mark.unit
T0 = 1_800_000_000.0  # an hour boundary
STEP_SECONDS = 10  # a window every 10 s, each 10 s long: 2 h 10 min in 790 windows a GPU


def window(g: int, i: int) -> GpuRow:
    return GpuRow(host="n", uuid=f"GPU-{g}", mig_instance=None, gpu_index=g, name="NVIDIA H200", sku="h200-sxm",
                  ts=T0 + STEP_SECONDS * i + 3, window_seconds=float(STEP_SECONDS),
                  bottleneck=BOTTLENECKS[(i // 50 + g) % 3], stale=False,
                  ofu=None if i % 19 == 0 else 0.2 + 0.1 * g + 0.001 * (i % 37), tensor_active=0.7,
                  sm_clock_hertz=1.4e9, sm_active=0.9, sm_occupancy=0.2, dram_bandwidth=0.3, power_watts=600.0)


def test_a_report_over_closed_hours_the_open_hour_and_the_open_minute_adds_up_to_its_windows(tmp_path):
    store = Store(tmp_path / "kf.db")
    windows = {g: [window(g, i) for i in range(790)] for g in range(2)}
    shares = {0: 1.0, 1: 0.5}
    for i in range(790):
        store.write([windows[g][i] for g in range(2)],
                    [JobRow("a", "slurm", "ana", "n", f"GPU-{g}", None, windows[g][i].ts, shares[g], g == 1)
                     for g in range(2)])
    report = store.job_report("a")
    assert report["first_seen"] == T0 + 3 and report["last_seen"] == T0 + 7893
    for g, row in enumerate(report["gpus"]):
        valued = [w for w in windows[g] if w.ofu is not None]
        assert row["seconds"] == 790 * STEP_SECONDS and row["mean_share"] == shares[g]
        assert row["ofu_ratio"] == pytest.approx(sum(w.ofu for w in valued) / len(valued), rel=1e-12)
        assert row["approximate"] is (g == 1)
    by_class: dict[str, float] = {}
    for w in windows[0] + windows[1]:
        by_class[w.bottleneck] = by_class.get(w.bottleneck, 0.0) + w.window_seconds
    assert report["bottleneck_seconds"] == pytest.approx(by_class)
    assert list(report["bottleneck_seconds"]) == sorted(by_class, key=lambda c: -by_class[c])

    def expected(seconds: int) -> dict[float, float]:
        sums: dict[float, list[float]] = {}
        for g in range(2):
            for w in windows[g]:
                if w.ofu is not None:
                    s = sums.setdefault(math.floor(w.ts / seconds) * seconds, [0.0, 0.0])
                    s[0] += w.ofu * shares[g] * w.window_seconds
                    s[1] += shares[g] * w.window_seconds
        return {ts: a / b for ts, (a, b) in sorted(sums.items())}

    hours = {p["ts"]: p["ofu_ratio"] for p in report["timeline_1h"]}
    minutes = {p["ts"]: p["ofu_ratio"] for p in report["timeline_1m"]}
    assert list(hours) == [T0, T0 + 3600, T0 + 7200]  # two closed hours and the open one
    assert hours == pytest.approx(expected(3600), rel=1e-12)
    assert len(minutes) == 132 and minutes == pytest.approx(expected(60), rel=1e-12)
