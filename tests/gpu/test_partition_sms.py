"""Profiles open together on one GPU run on SMs of their own: a kernel that writes the SM each of
its blocks ran on (PTX ``%smid``), launched on each partition's stream, sees disjoint sets — the
pair a:64 + b:32 the placement benchmarks emulate shared 32 SMs until 2026-12-01."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def sms_used(stream) -> set[int]:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def smid(out):
        pid = tl.program_id(0)
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
        tl.store(out + pid, sm)

    blocks = 8192  # many waves over any partition: every SM of it gets some
    with torch.cuda.stream(stream):
        out = torch.full((blocks,), -1, dtype=torch.int32, device="cuda")
        smid[(blocks,)](out)
    stream.synchronize()
    return set(out.tolist())


def test_two_open_profiles_share_no_sm_and_a_closed_ones_groups_are_reused():
    from kernelfleet.profile.devices import DeviceProfile, ProfileSpec

    a, b = ProfileSpec("a", 64), ProfileSpec("b", 32)
    with DeviceProfile(a) as on_a, on_a.active() as stream_a, DeviceProfile(b) as on_b, on_b.active() as stream_b:
        used_a, used_b = sms_used(stream_a), sms_used(stream_b)
        print(f"a ran on {len(used_a)} SMs {sorted(used_a)[:4]}..., b on {len(used_b)} SMs {sorted(used_b)[:4]}...")
        assert on_a.sms == 64 and on_b.sms == 32
        assert 32 < len(used_a) <= 64 and 16 < len(used_b) <= 32
        assert not used_a & used_b
    with DeviceProfile(b) as alone, alone.active() as stream:  # nothing else open: b starts at the first SM group
        assert sms_used(stream) & used_a
