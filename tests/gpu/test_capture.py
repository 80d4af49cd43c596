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


@pytest.mark.parametrize("host", [False, True])
def test_saved_state_puts_back_every_written_byte_and_on_the_host_takes_no_gpu_memory(host):
    """``saved_state`` (``host``: the placed server's, in pinned host memory): with every byte a launch
    of the decode step may write overwritten, the restore puts each back, and the step replays to its
    first outputs; kept on the host, the copy allocates nothing on the GPU."""
    import torch

    from kernelfleet.analyze import capture_step
    from kernelfleet.kernels.cuda.replay import device_bytes, saved_state, written_spans

    captured, program = capture_step("llama-decode")
    captured.replay()
    first = [t.clone() for t in captured.output_tensors()]
    spans = [device_bytes(start, end - start) for start, end in written_spans([program])]
    was = [span.clone() for span in spans]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    restore = saved_state(program, host=host)
    grew = torch.cuda.memory_allocated() - before
    assert grew == 0 if host else grew >= sum(span.numel() for span in spans)
    for span in spans:
        span.fill_(0x5A)
    restore()
    torch.cuda.synchronize()
    assert all(torch.equal(span, saved) for span, saved in zip(spans, was))
    captured.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(first, captured.output_tensors()))
