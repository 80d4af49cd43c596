"""Serving rates per strategy, on numbers worked out by hand."""

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.plan.serving import Phase, rates

pytestmark = pytest.mark.unit


def test_rates_by_hand():
    prefill = Phase({"a": 0.10, "b": 0.20}, placed_seconds=0.08, rows=1)
    decode = Phase({"a": 0.40, "b": 0.20}, placed_seconds=0.15, rows=16)
    r = rates(prefill, decode, output_tokens=32, kv_bytes_per_request=1_000_000, link_bytes_per_second=1e9)
    # a: 0.1 + 32 * 0.4 / 16 = 0.9 s per request; b: 0.2 + 0.4 = 0.6 s
    assert r["single:a"] == pytest.approx(1 / 0.9) and r["single:b"] == pytest.approx(1 / 0.6)
    assert r["replicas"] == pytest.approx(1 / 0.9 + 1 / 0.6)
    # prefill on a (10/s), decode on b (16 / (32 * 0.2) = 2.5/s), link 1000/s: 2.5/s
    assert r["pd-split (prefill:a/decode:b)"] == pytest.approx(2.5)
    # 0.08 + 32 * 0.15 / 16 = 0.38 s
    assert r["kernel placement"] == pytest.approx(1 / 0.38)


def test_a_slow_link_caps_the_split():
    prefill = Phase({"a": 0.10, "b": 0.20}, placed_seconds=0.08, rows=1)
    decode = Phase({"a": 0.40, "b": 0.20}, placed_seconds=0.15, rows=16)
    r = rates(prefill, decode, 32, kv_bytes_per_request=1_000_000_000, link_bytes_per_second=1e9)
    assert r["pd-split (prefill:a/decode:b)"] == pytest.approx(1.0)


def test_needs_two_devices_and_positive_counts():
    one = Phase({"a": 0.1}, 0.1, 1)
    with pytest.raises(UsageError, match="two devices"):
        rates(one, one, 8, 0, 1e9)
    two = Phase({"a": 0.1, "b": 0.1}, 0.1, 1)
    with pytest.raises(UsageError, match="at least 1"):
        rates(two, two, 0, 0, 1e9)
