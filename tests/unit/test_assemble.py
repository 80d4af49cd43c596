"""From a raw capture to a program: buffers, pointer matching, access sources, checks."""

import ctypes
import itertools

import pytest
import torch

from kernelfleet.analyze import census
from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import dependencies
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.checks import probe_disagreements, unsound_writes, with_observations
from kernelfleet.kernels.cuda._marshal import extra_buffer
from kernelfleet.kernels.cuda.capture import OpRecorder, op_tensors
from kernelfleet.kernels.cuda.replay import changed_runs
from kernelfleet.kernels.raw import RawCapture, RawNode, RawOp, RawTensor, Region
from kernelfleet.workloads.steps import hf_llama, make
from kernelfleet.workloads.targets import load_step

pytestmark = pytest.mark.unit

W, X, Y, Z, WS = 0x7F00_0000_0000, 0x7F00_0010_0000, 0x7F00_0020_0000, 0x7F00_0028_0000, 0x7F00_0030_0000
SEGMENT = (0x7F00_0000_0000, 0x40_0000)

ADD_PTX = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry add_one(.param .u64 add_one_param_0, .param .u64 add_one_param_1, .param .u32 add_one_param_2)
.reqntid 128, 1, 1
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [add_one_param_0];
    ld.param.u64 %rd2, [add_one_param_1];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f1, [%rd6];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd7], %f2;
    ret;
}
"""


def ptr(value: int) -> str:
    return value.to_bytes(8, "little").hex()


def tensor(address: int, nbytes: int, mode: str) -> RawTensor:
    return RawTensor(address, nbytes, address, nbytes, mode)


def capture_record() -> RawCapture:
    """mm(X, W) -> Y with a cuBLAS-like struct hiding pointers and a workspace; a Triton add; a memset."""
    struct = bytes(8) + bytes.fromhex(ptr(X)) + bytes.fromhex(ptr(W + 64)) + bytes.fromhex(ptr(Y)) \
        + bytes.fromhex(ptr(WS + 256)) + (12345).to_bytes(8, "little")
    nodes = [
        RawNode("memset", dst=Y, length_bytes=1024, value=0),
        RawNode("kernel", "nvjet_sm90_tst_128x64", (4, 1, 1), (384, 1, 1), 1024, None, ((0, len(struct), struct.hex()),)),
        RawNode("event_record"),
        RawNode("kernel", "add_one", (1, 1, 1), (128, 1, 1), 0, None,
                ((0, 8, ptr(Y)), (8, 8, ptr(Z + 512)), (16, 4, (7).to_bytes(4, "little").hex()))),
        RawNode("kernel", "mystery", (1, 1, 1), (32, 1, 1), 0, None, ((0, 8, ptr(X)),)),
    ]
    ops = [RawOp("aten.zero_.default", 0, 1, (tensor(Y, 1024, "readwrite"),)),
           RawOp("aten.mm.default", 1, 2, (tensor(X, 1024, "read"), tensor(W, 4096, "read"), tensor(Y, 1024, "write")),
                 flops=2 * 16 * 16 * 16, precision="bf16")]
    regions = [Region(W, 4096, "weight", "layer.weight"), Region(X, 1024, "input", "input0"),
               Region(Z, 1024, "output", "output0")]
    return RawCapture(nodes, ops, regions, [SEGMENT], {"add_one": [{"ptx": ADD_PTX, "threads": 128, "shared_bytes": 0}]})


def test_buffers_pointers_and_sources():
    program = assemble(capture_record())
    by_address = {b.address: b for b in program.buffers}
    assert [launch.kind for launch in program.launches] == ["memset", "kernel", "kernel", "kernel"]  # event dropped
    assert by_address[W].role == "weight" and by_address[W].name == "layer.weight"
    assert by_address[X].role == "input"
    workspace = [b for b in program.buffers if b.role == "workspace"]
    assert len(workspace) == 1 and workspace[0].address <= WS + 256 < workspace[0].address + workspace[0].size_bytes

    memset, mm, add, mystery = program.launches
    assert [(a.mode, a.source, a.length_bytes) for a in memset.accesses] == [("write", "graph-node", 1024)]
    # mm: schema for the op's tensors, conservative for the workspace its struct points at
    modes = {(program.buffers[a.buffer].address, a.mode, a.source) for a in mm.accesses}
    assert modes == {(X, "read", "schema"), (W, "read", "schema"), (Y, "write", "schema"),
                     (workspace[0].address, "readwrite", "conservative")}
    assert mm.op == "aten.mm.default" and mm.pinned is None
    pointers = [p for d in mm.params for p in d.pointers]
    assert [(p.at, p.offset_bytes) for p in pointers][:3] == [(8, 0), (16, 64), (24, 0)]
    # add_one: PTX says param 0 read, param 1 written, from the pointer to the buffer's end
    assert {(program.buffers[a.buffer].address, a.mode, a.source, a.offset_bytes, a.length_bytes)
            for a in add.accesses} == {(Y, "read", "ptx-static", 0, 1024), (Z, "write", "ptx-static", 512, 512)}
    # no PTX and no op: pinned, conservative
    assert mystery.pinned and "no PTX" in mystery.pinned
    assert [(a.mode, a.source) for a in mystery.accesses] == [("readwrite", "conservative")]


def test_edges_and_census():
    program = assemble(capture_record())
    edges = dependencies(program)
    # mm writes Y over the memset (no RAW edge), add reads Y; the memset's bytes are all overwritten
    assert [(e.src, e.dst, e.bytes) for e in edges] == [(1, 2, 1024)]
    numbers = census(program, edges)
    assert numbers["kernels"] == 3 and numbers["copies"] == 1 and numbers["pinned"] == 1
    assert numbers["kernels_with_ptx"] == 1
    assert numbers["launches_by_source"] == {"graph-node": 1, "schema": 1, "ptx-static": 1, "conservative": 1}


def test_ptx_variant_must_fit_the_launch():
    raw = capture_record()
    raw.ptx["add_one"][0]["threads"] = 256  # another autotuned variant: not the one launched
    add = assemble(raw).launches[2]
    assert add.pinned and {a.source for a in add.accesses} == {"conservative"}


def test_op_claiming_nodes_beyond_the_capture_is_an_error():
    raw = capture_record()
    raw.ops.append(RawOp("aten.add.Tensor", 3, 9))
    with pytest.raises(UsageError, match="claims nodes"):
        assemble(raw)


def test_round_trip(tmp_path):
    raw = capture_record()
    raw.save(tmp_path / "c.json.gz")
    again = RawCapture.load(tmp_path / "c.json.gz")
    assert again.nodes == raw.nodes and again.ops == raw.ops and again.regions == raw.regions
    assert assemble(again).to_json() == assemble(raw).to_json()
    (tmp_path / "bad.json").write_text('{"kernelfleet_capture": 1, "nodes": [{"kind": "kernel", "bogus": 1}]}')
    with pytest.raises(UsageError, match="bad.json"):
        RawCapture.load(tmp_path / "bad.json")


def test_unsound_writes_and_probe_disagreements():
    program = assemble(capture_record())
    y, z = (next(b.id for b in program.buffers if b.address == a) for a in (Y, Z))
    # the add kernel claims writes to Z from 512: a change there is fine, one in Y is not
    assert unsound_writes(program, {2: [(z, 512, 700)]}) == []
    [finding] = unsound_writes(program, {2: [(z, 500, 700), (y, 100, 200)]})[1:]
    assert (finding.launch, finding.buffer, finding.start, finding.end) == (2, y, 100, 200)
    assert unsound_writes(program, {2: [(z, 500, 700)]})[0].end == 512
    # a probed read inside Y agrees; a probed read of Z (only written) does not
    assert probe_disagreements(program, {2: [("read", Y + 600, Y + 700)]}) == []
    [d] = probe_disagreements(program, {2: [("read", Z + 512, Z + 528)]})
    assert (d.buffer, d.start, d.end, d.what) == (z, 512, 528, "read outside static")
    [outside] = probe_disagreements(program, {2: [("write", 16, 32)]})
    assert outside.what == "outside buffers"
    grown = with_observations(program, {2: [(y, 100, 200)]}, {2: [("read", Z + 512, Z + 528)]})
    assert {a.source for a in grown.launches[2].accesses} == {"ptx-static", "memory-diff", "ptx-dynamic"}
    assert unsound_writes(grown, {2: [(y, 100, 200)]}) == []


def test_schema_modes_of_aten_ops():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    out = torch.empty(4, 4)
    records = op_tensors(torch.ops.aten.mm.default, (a, b), {}, torch.mm(a, b))
    assert sorted(r.mode for r in records) == ["read", "read", "write"]
    [inplace, other] = op_tensors(torch.ops.aten.add_.Tensor, (a, b), {}, a)
    assert (inplace.address, inplace.mode) == (a.data_ptr(), "readwrite") and other.mode == "read"
    records = op_tensors(torch.ops.aten.mm.out, (a, b), {"out": out}, out)
    assert {(r.address, r.mode) for r in records} >= {(out.data_ptr(), "write")}
    view = a[1:3, ::2]
    [r] = op_tensors(torch.ops.aten.clone.default, (view,), {}, None)
    assert r.address == a.data_ptr() + 16 and r.extent_bytes == (4 + 2 + 1) * 4 and r.storage_bytes == 64


def test_op_recorder_on_a_real_model_step():
    step = make("llama", "tiny", "decode", device="cpu")
    counter = itertools.count()
    with OpRecorder(lambda: next(counter)) as recorder:  # every op "creates" one node
        step.fn(*step.args)
    names = [op.name for op in recorder.ops]
    assert "aten.mm.default" in names or "aten.addmm.default" in names
    caches = {b.untyped_storage().data_ptr() for n, b in step.module.named_buffers() if "cache" in n}
    cache_writes = [t for op in recorder.ops for t in op.tensors if t.storage_address in caches and "write" in t.mode]
    assert cache_writes, "the decode step writes its KV cache in place"
    matmuls = [op for op in recorder.ops if op.flops > 0]
    assert matmuls and all(op.precision for op in matmuls)


def test_load_step_errors():
    with pytest.raises(UsageError, match="MODULE:FACTORY"):
        load_step("nocolon")
    with pytest.raises(UsageError, match="cannot import"):
        load_step("no.such.module:f")
    with pytest.raises(UsageError, match="no callable"):
        load_step("kernelfleet.workloads.steps:nothing_here")


def test_changed_runs_join_close_bytes():
    before = torch.zeros(10_000, dtype=torch.uint8)
    now = before.clone()
    now[0:128] = 1
    now[4096:6000:2] = 3  # a written value that keeps every other byte is one write
    now[9000] = 1
    assert changed_runs(now, before) == [(0, 128), (4096, 5999), (9000, 9001)]
    assert changed_runs(before, before) == []


def test_extra_argument_buffer():
    blob = ctypes.create_string_buffer(bytes(range(40)), 40)
    size = ctypes.c_size_t(40)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(blob), 2, ctypes.addressof(size), 0)
    assert extra_buffer(ctypes.addressof(extra)) == bytes(range(40))
    assert extra_buffer(ctypes.addressof((ctypes.c_void_p * 1)(0))) == b""


def test_op_recorder_on_a_transformers_llama():
    step = hf_llama(device="cpu")
    counter = itertools.count()
    with OpRecorder(lambda: next(counter)) as recorder:
        logits = step.fn(*step.args)
    assert tuple(logits.shape) == (2, 64, 512)
    weights = {p.untyped_storage().data_ptr() for p in step.module.parameters()}
    read = {t.storage_address for op in recorder.ops for t in op.tensors if t.mode == "read"}
    assert len(weights & read) >= len(weights) - 1  # every weight is read (the tied head may share one)
    assert sum(op.flops for op in recorder.ops if op.name.startswith(("aten.mm", "aten.bmm"))) > 0
