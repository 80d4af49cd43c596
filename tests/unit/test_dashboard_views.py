"""What the dashboard's fleet views and job page compute (kernelfleet/fleet/views.py, report.py's
spent_below), the store queries behind them on a real SQLite store, and the endpoints that serve them."""

import pytest
from fastapi.testclient import TestClient

from kernelfleet.catalog import Catalog
from kernelfleet.fleet.agent import Agent
from kernelfleet.fleet.report import job_report, spent_below
from kernelfleet.fleet.server import agent_app
from kernelfleet.fleet.store import GpuRow, JobRow, Store
from kernelfleet.fleet.views import catalog_price, heatmap, heatmap_step, host_rows, worst_gpus

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0  # a whole hour
CATALOG = Catalog.load()


def gpu(host, index, ofu, mig=None, stale=False):
    return {"host": host, "gpu": index, "mig_instance": mig, "uuid": f"GPU-{host}-{index}-{mig}", "ofu_ratio": ofu,
            "stale": stale, "sku": "h200-sxm", "timestamp_seconds": T0}


def test_a_host_row_is_its_whole_gpus_mean_and_worst():
    rows = [gpu("a", 0, 0.5), gpu("a", 1, 0.1), gpu("a", 1, 0.01, mig=3), gpu("a", 2, None, stale=True), gpu("b", 0, None)]
    a, b = host_rows(rows)
    assert (a.host, a.gpus, a.gpus_with_ofu, a.stale) == ("a", 3, 2, 1)
    assert a.mean_ofu_ratio == pytest.approx(0.3) and a.worst.label == "a / GPU 1"  # the MIG slice is not a GPU
    assert (b.mean_ofu_ratio, b.worst) == (None, None)  # no OFU is not a low OFU


def test_the_worst_gpus_leave_out_the_unmeasured_and_break_ties_by_host():
    rows = [gpu("b", 0, 0.0), gpu("a", 3, 0.0), gpu("a", 1, 0.4), gpu("c", 0, None), gpu("a", 0, 0.2, mig=1)]
    assert [g.label for g in worst_gpus(rows, 2)] == ["a / GPU 3", "b / GPU 0"]
    assert [g.label for g in worst_gpus(rows, 10)] == ["a / GPU 3", "b / GPU 0", "a / GPU 1"]


@pytest.mark.parametrize(("seconds", "step"), [(900, 60), (3600, 60), (6 * 3600, 240), (86400, 960), (7 * 86400, 7200)])
def test_a_heatmap_has_at_most_90_columns_of_whole_minutes_or_hours(seconds, step):
    assert heatmap_step(T0 - seconds, T0) == step
    assert seconds / step <= 90


def test_the_heatmap_puts_each_value_in_its_gpus_row_and_its_steps_column():
    grid = [("a", "U1", 0, None, int(T0), 0.25), ("a", "U1", 0, None, int(T0) + 120, 0.5),
            ("b", "U2", 1, None, int(T0) + 60, None), ("b", "U2", 1, None, int(T0) - 60, 0.9)]  # before the start
    m = heatmap(grid, T0, T0 + 180, 60)
    assert (m.start_seconds, m.step_seconds, m.columns) == (int(T0), 60, 3)
    assert [(r.label, r.ofu_permille) for r in m.rows] == [("a / GPU 0", [250, None, 500]), ("b / GPU 1", [None, None, None])]


def window(store, minute, second, ofu, job="train", uuid="GPU-a", share=1.0):
    ts = T0 + 60 * minute + second
    store.write([GpuRow("node-a", uuid, None, 0, "NVIDIA H200", "h200-sxm", ts, 1.0, "tensor-bound", False, ofu, ofu,
                        1.9e9, 0.9, 0.3, 0.2, 600.0)],
                [JobRow(job, "slurm", "ana", "node-a", uuid, None, ts, share, share < 1)])


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "kf.db", clock=lambda: T0 + 600)
    # ten windows of 1 s a minute: minute 0 at OFU 0.2, minute 1 at 0.6, minute 2 at 0.1 (the job's share half)
    for minute, ofu, share in [(0, 0.2, 1.0), (1, 0.6, 1.0), (2, 0.1, 0.5)]:
        for second in range(10):
            window(s, minute, second, ofu, share=share)
    window(s, 3, 0, None)  # a window with no OFU: in no minute below anything
    yield s
    s.close()


def test_the_store_grid_is_each_gpus_time_weighted_ofu_per_step(store):
    grid = store.ofu_grid(T0, T0 + 240, 60)
    assert [row[:5] for row in grid] == [("node-a", "GPU-a", 0, None, int(T0) + 60 * m) for m in range(4)]
    assert [row[5] for row in grid] == [pytest.approx(0.2), pytest.approx(0.6), pytest.approx(0.1), None]
    (two,) = [r for r in store.ofu_grid(T0, T0 + 240, 120) if r[4] == int(T0)]
    assert two[5] == pytest.approx(0.4)  # a step of two minutes: the mean of both


def test_seconds_below_count_the_jobs_share_of_the_minutes_under_the_threshold(store):
    assert store.job_seconds_below("train", 0.3) == {("GPU-a", None): pytest.approx(10 + 10 * 0.5)}
    assert store.job_seconds_below("train", 0.05) == {}
    assert store.job_seconds_below("nobody", 0.3) == {}


def test_spent_below_prices_each_gpu_and_says_what_has_no_price(store):
    rows = job_report(store.job_report("train"))
    spent = spent_below(rows, 0.3, {("GPU-a", None): 7200.0}, lambda g: 4.0)
    assert (spent.gpu_hours, spent.usd, spent.unpriced_gpu_hours) == (2.0, 8.0, 0.0)
    unpriced = spent_below(rows, 0.3, {("GPU-a", None): 3600.0}, lambda g: None)
    assert (unpriced.gpu_hours, unpriced.usd, unpriced.unpriced_gpu_hours, unpriced.gpus[0].usd) == (1.0, 0.0, 1.0, None)


def test_a_gpu_is_priced_at_the_catalogs_lowest_price_by_nvml_name_or_sku_key():
    h100 = catalog_price(CATALOG, "NVIDIA H100 80GB HBM3")
    assert h100.usd_per_hour == min(p.usd_per_hour for p in CATALOG.get("h100-sxm").prices)
    assert catalog_price(CATALOG, "h100-sxm") == h100  # Prometheus labels carry the SKU key
    assert catalog_price(CATALOG, "NVIDIA H200 NVL") is None  # in the catalog, without a public price
    assert catalog_price(CATALOG, "Some Future GPU") is None


def test_the_job_report_endpoint_serves_the_rows_and_the_spend(store):
    client = TestClient(agent_app(Agent(source=None, store=store, catalog=CATALOG, clock=lambda: T0 + 600), store))
    page = client.get("/api/report/train", params={"below_ofu": 0.3}).json()
    rows = job_report(store.job_report("train"))
    assert page["report"]["gpus"][0]["ofu_ratio"] == rows.gpus[0].ofu_ratio
    assert page["report"]["bottleneck_shares"] == rows.bottleneck_shares
    price = CATALOG.get("h200-sxm").prices[0]
    assert page["prices"]["NVIDIA H200"] == {"usd_per_hour": price.usd_per_hour,
                                             "source": f"catalog: {price.provider}, {price.date} ({price.source})"}
    assert page["spent"]["gpu_hours"] == pytest.approx(15 / 3600)
    assert page["spent"]["usd"] == pytest.approx(15 / 3600 * price.usd_per_hour)
    mine = client.get("/api/report/train", params={"below_ofu": 0.3, "usd_per_gpu_hour": 10}).json()
    assert mine["spent"]["usd"] == pytest.approx(15 / 3600 * 10)
    assert mine["prices"]["NVIDIA H200"]["source"].startswith("set on the page")
    assert client.get("/api/report/nobody").status_code == 404
    bad = client.get("/api/report/train", params={"below_ofu": 2})
    assert bad.status_code == 422 and "below_ofu" in bad.text
    assert client.get("/api/heatmap", params={"start": T0 + 10, "end": T0}).status_code == 422
    heat = client.get("/api/heatmap", params={"start": T0, "end": T0 + 240}).json()
    assert heat["rows"][0]["ofu_permille"] == [200, 600, 100, None]
