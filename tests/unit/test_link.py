"""The executor's link kernels, checked by kernelfleet's own PTX analysis, and the link throttle."""

from importlib import resources

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.ptx.access import analyze
from kernelfleet.ptx.parser import parse
from kernelfleet.runtime.link import Throttle


def test_link_kernels_read_source_and_write_destination_only():
    found = {k.entry: k for k in analyze(parse(resources.files("kernelfleet.runtime").joinpath("link.ptx").read_text()))}
    assert set(found) == {"kf_copy16", "kf_copy1", "kf_wait"}
    for name in ("kf_copy16", "kf_copy1"):
        assert not found[name].pinned
        assert found[name].params == {"dst": "write", "src": "read", **{p: "unused" for p in found[name].params
                                                                         if p not in ("dst", "src")}}
    assert found["kf_wait"].params == {"nanoseconds": "unused"} and not found["kf_wait"].evidence


def test_throttle_time_is_latency_plus_bytes_over_bandwidth():
    link = Throttle(25e9 / 8, 5e-6)  # 25 Gbit/s
    assert link.seconds(0) == pytest.approx(5e-6)
    assert link.seconds(3_125_000) == pytest.approx(5e-6 + 1e-3)


@pytest.mark.parametrize("bandwidth, latency", [(0, 0), (-1, 0), (1e9, -1e-6)])
def test_throttle_refuses_nonsense(bandwidth, latency):
    with pytest.raises(UsageError, match="positive bandwidth"):
        Throttle(bandwidth, latency)


def test_link_kernels_assemble_with_ptxas(ptxas, tmp_path):
    assert ptxas(resources.files("kernelfleet.runtime").joinpath("link.ptx").read_text(), tmp_path) == ""
