"""PTX on a real GPU: hand-written Triton kernels, compiled by Triton for this GPU's architecture
(sm_90 on an H200) and captured in a CUDA graph, get their accesses from the static PTX analysis;
the dynamic range probe (``ptx/probe.py``) then runs each rewritten kernel once and every byte range
it records lies inside what the static analysis claimed, over exactly the tensors each kernel
touches."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.gpu

N = 1 << 16  # elements of each vector; a multiple of BLOCK, so no lane is masked off
ROWS, COLS = 64, 1000  # row_sum's matrix: a row is not a power of two, so its mask is live
BLOCK = 1024


def step(x, y, m):
    import ptx_kernels  # the PTX tests' kernels (tests/ptx_kernels.py)
    import torch

    out = torch.empty_like(x)
    ptx_kernels.add[(N // BLOCK,)](x, y, out, N, BLOCK=BLOCK)
    sums = torch.empty(ROWS, device=m.device, dtype=m.dtype)
    ptx_kernels.row_sum[(ROWS,)](m, sums, COLS, m.stride(0), BLOCK=BLOCK)
    return out, sums


def test_probe_agrees_with_static_analysis(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    import torch

    from kernelfleet.kernels.assemble import assemble
    from kernelfleet.kernels.checks import probe_disagreements, unsound_writes
    from kernelfleet.kernels.cuda.capture import capture
    from kernelfleet.kernels.cuda.replay import observe

    # A Triton cache of its own: the probe needs exactly one PTX variant of a kernel name, and the
    # PTX tests compile these kernels for other targets under the same names into the shared cache.
    # Triton reads the variable when it compiles, which here is in the capture's warm-up.
    cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    m = torch.randn(ROWS, COLS, device="cuda")
    captured = capture(step, (x, y, m), what="gpu-tier triton", ptx_dirs=[cache])
    program = assemble(captured.raw)
    mine = {launch.index: launch for launch in program.launches if launch.kind == "kernel"}
    assert sorted(launch.name for launch in mine.values()) == ["add", "row_sum"]
    major, minor = torch.cuda.get_device_capability()
    for launch in mine.values():
        (variant,) = captured.raw.ptx[launch.name]
        target = re.search(r"^\s*\.target\s+sm_(\d+)", variant["ptx"], re.MULTILINE)[1]
        print(f"{launch.name}: PTX .target sm_{target}; static accesses "
              f"{[(a.mode, a.buffer, a.source) for a in launch.accesses]}")
        assert target == f"{major}{minor}"
        assert any(a.source == "ptx-static" for a in launch.accesses)

    seen = observe(captured, program)
    assert sorted(seen.probed) == sorted(mine), f"probed {sorted(seen.probed)}, unprobed {seen.unprobed}"
    disagree = probe_disagreements(program, seen.probed)
    unsound = unsound_writes(program, seen.writes)
    print(f"probed {len(seen.probed)} kernels, {len(disagree)} disagreements, {len(unsound)} unsound writes")
    assert disagree == [] and unsound == []

    out, sums = captured.output_tensors()
    tensors = {"add": {"read": [x, y], "write": [out]}, "row_sum": {"read": [m], "write": [sums]}}
    for index, launch in mine.items():
        for mode, expected in tensors[launch.name].items():
            ranges = [(lo, hi) for how, lo, hi in seen.probed[index] if how == mode]
            print(f"{launch.name} {mode}: {len(ranges)} probe sites")
            for t in expected:  # each tensor reached from its first byte to its last, nothing beyond
                start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
                inside = [(lo, hi) for lo, hi in ranges if start <= lo < end]
                assert inside and min(lo for lo, _ in inside) == start and max(hi for _, hi in inside) == end
            assert all(any(t.data_ptr() <= lo and hi <= t.data_ptr() + t.numel() * t.element_size() for t in expected)
                       for lo, hi in ranges)
