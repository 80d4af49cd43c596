"""``python -m bench.serve_cpu --parts --quick``: every part of the serving path runs before and after,
over real HTTP, and the JSON of its table is the last line."""

import pytest
from recorded import bench_quick

pytestmark = pytest.mark.unit


def test_the_parts_table_has_every_part_before_and_after():
    table, report = bench_quick("serve_cpu", args=("--parts",))
    assert table.startswith("command: ") and "--parts" in table.splitlines()[0]
    rows = report["us_per_token"]
    assert len(rows) == 7 and "+ HTTP: uvicorn, loopback, raw client" in rows
    assert all(row["before"] > 0 and row["after"] > 0 for row in rows.values())
    assert set(report["client_share_us_per_token"]) == {"before", "after"} and report["tokens"] == 200
    assert set(report["http_on_gpu_like_step_us_per_token"]) == {"before", "after"}
    for name in rows:
        assert name in table
