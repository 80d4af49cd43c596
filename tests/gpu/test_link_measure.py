"""The link between two disjoint partitions of one GPU as ``kernelfleet profile`` and
``python -m bench.link_cost`` measure it (``profile/linkcost.py``): graph memcpy nodes as the
executor adds them, between small kernels in each partition's context. The fits are positive,
sane for copies inside one GPU's memory, and the same when measured again."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

PAIR = ("a:64", "b:32")  # the placement benchmark's pair (bench/place_pairs.py)
FIXED_SECONDS = (0.2e-6, 20e-6)  # a graph memcpy node's fixed cost: more than 20 µs is not a node's own
RATE = (20e9, 5e12)  # bytes/s of a copy inside one H200 (HBM 4.8 TB/s, read and write): beyond is no copy
AGAIN = 0.25  # the fixed costs of two measurements agree within this (µs-sized medians: loose)


def test_the_link_between_two_partitions_is_measured_sanely_and_again_alike():
    from kernelfleet.profile.run import link_times, parse_profile

    specs = [parse_profile(p) for p in PAIR]
    first, second = link_times(specs)[0], link_times(specs)[0]
    print(f"\nbetween {first.between}\nqueued {first.queued}\nwait {first.wait_seconds * 1e6:.2f} µs")
    for fit in (first.between, first.queued):
        assert FIXED_SECONDS[0] <= fit.seconds_per_copy <= FIXED_SECONDS[1], fit
        assert RATE[0] <= fit.bytes_per_second <= RATE[1], fit
    assert 0 <= first.wait_seconds <= FIXED_SECONDS[1]
    for a, b in ((first.between, second.between), (first.queued, second.queued)):
        assert abs(a.seconds_per_copy - b.seconds_per_copy) <= AGAIN * a.seconds_per_copy
