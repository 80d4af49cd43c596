"""Capture on a real GPU, as ``kernelfleet analyze`` does it: the tiny Llama decode step captured as
a CUDA graph, assembled, replayed node by node with the same outputs as the graph, and every write
the memory diff saw covered by a claimed access (no unsound write)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_reference_step_capture_checks_out(tmp_path):
    from kernelfleet.analyze import analyze_step

    found = analyze_step("kernelfleet.workloads.steps:llama_decode", tmp_path)
    print({k: found[k] for k in ("step", "launches", "kernels", "kernels_with_ptx", "edges", "access_sources",
                                 "node_by_node_equals_graph", "unsound_writes", "probe_disagreements",
                                 "probed_kernels")})
    assert found["launches"] > 10
    assert found["node_by_node_equals_graph"] is True
    assert found["unsound_writes"] == 0
    assert found["probe_disagreements"] == 0
    assert (tmp_path / "capture.json.gz").exists() and (tmp_path / "program.json").exists()
