"""Profile's whole-step graphs (``profile/steptime.py``) built on the null driver over the two
captures two H200s made of the 8B decode step (tests/data/h200x2-disagg): the graph of two devices'
steps launched together puts each chain's nodes in its own device's context, also where a device is
a whole GPU (no partition context: its capture's own). Until 2026-12-06 a whole GPU's chain was
added under no context at all, which the driver refused (``cuCtxPushCurrent``: invalid value)
when profile timed two whole-GPU profiles of one H100 together. And two profiles timed together
over one capture are refused in one line before anything reaches the GPU."""

from dataclasses import replace
from pathlib import Path

import pytest
from recorded import twin_replicas

from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.profile.steptime import StepGraph

pytestmark = pytest.mark.replay

RUNS = Path(__file__).parents[1] / "data" / "h200x2-disagg"


@pytest.mark.parametrize("contexts", [[None, None], ["a partition", None]])
def test_each_chain_of_the_together_graph_runs_in_its_own_devices_context(contexts):
    null = NullDriver()
    chains = [replace(r.captured, driver=null) for r in
              twin_replicas(RUNS, "llama8b-decode", ("compute", "bandwidth")).values()]
    graph = StepGraph(chains, free=True, contexts=contexts)
    graph.__enter__()  # not exited: that replays the captures, on a GPU
    try:
        launched = [x for x in null.added if x.kind == "launch"]
        per_chain = len(launched) // 2
        assert per_chain > 1000 and len(launched) == 2 * per_chain
        wanted = [where or chain.context for where, chain in zip(contexts, chains)]
        assert [x.ctx for x in launched] == [wanted[0]] * per_chain + [wanted[1]] * per_chain
        assert launched[per_chain].after == ()  # free: the second chain waits for nothing of the first
    finally:
        null.destroy(graph._graph, graph._executable)


def test_two_profiles_timed_together_over_one_capture_are_refused_before_the_gpu():
    """Their graphs would write the capture's buffers at once (on an H100 a device-side assert in an
    index kernel, docs/validation/h100-2026-12-06-profile-whole/side_by_side_call2.txt)."""
    from kernelfleet.errors import UsageError
    from kernelfleet.profile.devices import ProfileSpec
    from kernelfleet.profile.run import step_times

    captured = twin_replicas(RUNS, "llama8b-decode", ("compute",))["compute"].captured
    with pytest.raises(UsageError, match="profiles a and b are timed together over the same capture"):
        step_times({"a": [captured], "b": [captured]}, [ProfileSpec("a"), ProfileSpec("b")])
