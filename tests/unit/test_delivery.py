"""``plan.delivery.stale_reads`` on a small program with exact answers: it passes the executor's own
graph and names what a graph without one of its copies would get wrong, at the read or at the end."""

import pytest
from test_together import program

from kernelfleet.plan.delivery import stale_reads
from kernelfleet.plan.schedule import schedule

pytestmark = pytest.mark.unit


def without(nodes, reader):
    return [n for n in nodes if not (n.copy is not None and n.copy.reader == reader)]


def test_a_missing_input_copy_is_a_read_of_an_input_the_device_was_never_given():
    assignment = ["b", "a", "a", "a"]  # the input lives home (a); launch 0 reads it on b
    nodes = schedule(program(), assignment, "a")
    assert stale_reads(program(), assignment, "a", nodes) == []
    assert stale_reads(program(), assignment, "a", without(nodes, 0)) == [
        ("launch 0 (aten.silu.default) on b reads buffer 0 [0, 64) without the input ever copied there; one device "
        "reads it as it was before the step")]


def test_an_output_left_away_from_home_is_named():
    assignment = ["a", "a", "a", "b"]  # the gather writes the output on b: it must come home
    nodes = schedule(program(), assignment, "a")
    assert stale_reads(program(), assignment, "a", nodes) == []
    assert stale_reads(program(), assignment, "a", without(nodes, None)) == [
        "after the step, a holds output0 [0, 64) as it was before the step; one device leaves it as launch 3 left it"]
