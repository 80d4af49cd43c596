"""PTX parser and static access analysis, on PTX that Triton compiles here for sm_90 (no GPU
needed) and on nvcc-style and hand-written PTX under tests/data/ptx."""

from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.ptx import PtxSyntaxError, analyze, parse

pytestmark = pytest.mark.unit
PTX = Path(__file__).parents[1] / "data" / "ptx"


@pytest.fixture(scope="session")
def triton_ptx():
    """Compile each test kernel once per session (a compile takes about a second)."""
    pytest.importorskip("triton")
    import ptx_kernels

    cache: dict[tuple[str, int], str] = {}

    def get(name: str, capability: int = 90) -> str:
        if (name, capability) not in cache:
            cache[name, capability] = ptx_kernels.compile_ptx(name, capability)
        return cache[name, capability]

    return get


def access_by_user_name(ptx: str, name: str):
    """Analyse a Triton kernel; name its params as the Python signature does (Triton numbers them
    `<kernel>_param_<i>`, scalars included, then appends its hidden scratch pointers)."""
    import ptx_kernels

    (access,) = analyze(parse(ptx))
    user = list(ptx_kernels.KERNELS[name][1])
    rename = {f"{name}_param_{i}": n for i, n in enumerate(user)}
    return access, {rename.get(p, p): kind for p, kind in access.params.items()}


def test_elementwise_add_with_masks(triton_ptx):
    access, params = access_by_user_name(triton_ptx("add"), "add")
    assert params == {"x": "read", "y": "read", "out": "write",
                      "add_param_4": "unused", "add_param_5": "unused"}
    assert not access.pinned and access.reasons == []


def test_in_place_update_is_readwrite(triton_ptx):
    access, params = access_by_user_name(triton_ptx("add_inplace"), "add_inplace")
    assert params == {"x": "readwrite", "y": "read",
                      "add_inplace_param_3": "unused", "add_inplace_param_4": "unused"}
    assert not access.pinned


def test_row_reduction(triton_ptx):
    access, params = access_by_user_name(triton_ptx("row_sum"), "row_sum")
    assert params == {"inp": "read", "out": "write",
                      "row_sum_param_4": "unused", "row_sum_param_5": "unused"}
    assert not access.pinned


def test_atomic_add_is_readwrite_and_loaded_index_is_an_offset(triton_ptx):
    # `counts + bins` indexes with a 32-bit value loaded from x: an offset, not a pointer.
    access, params = access_by_user_name(triton_ptx("histogram"), "histogram")
    assert params == {"x": "read", "counts": "readwrite",
                      "histogram_param_3": "unused", "histogram_param_4": "unused"}
    assert not access.pinned
    module = parse(triton_ptx("histogram"))
    assert [i.name for i in module.entries[0].instructions if i.opcode == "atom"] == \
        ["atom.global.gpu.acq_rel.add.u32"]


def test_matmul_cp_async_on_sm90(triton_ptx):
    ptx = triton_ptx("matmul")
    access, params = access_by_user_name(ptx, "matmul")
    assert params == {"a": "read", "b": "read", "c": "write",
                      "matmul_param_6": "unused", "matmul_param_7": "unused"}
    assert not access.pinned
    ops = {i.name for i in parse(ptx).entries[0].instructions}
    assert "cp.async.cg.shared.global" in ops
    reads = {p for line, p, kind in access.evidence if kind == "read"}
    assert reads == {"matmul_param_0", "matmul_param_1"}


def test_matmul_tma_device_descriptors(triton_ptx):
    # Triton builds the tensor maps in shared memory (`tensormap.replace ... global_address`),
    # copies them to its global scratch (hidden param 6) and points cp.async.bulk.tensor at them.
    ptx = triton_ptx("matmul_tma")
    access, params = access_by_user_name(ptx, "matmul_tma")
    assert params == {"a": "read", "b": "read", "c": "write",
                      "matmul_tma_param_6": "readwrite", "matmul_tma_param_7": "unused"}
    assert not access.pinned
    names = [i.name for i in parse(ptx).entries[0].instructions]
    assert any(n.startswith("cp.async.bulk.tensor.2d.shared::cta.global") for n in names)
    assert any(n.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for n in names)


def test_pointer_loaded_from_memory_pins_the_kernel(triton_ptx):
    ptx = triton_ptx("gather_ptr")
    access, params = access_by_user_name(ptx, "gather_ptr")
    assert access.pinned
    assert params["table"] == "read" and params["out"] == "write"
    (reason,) = access.reasons
    lines = ptx.splitlines()
    load_table = next(n for n, t in enumerate(lines, 1) if "ld.global.b64" in t)
    chased = next(n for n, t in enumerate(lines, 1) if "ld.global.b32" in t)
    assert reason == (f"line {chased}: ld.global.b32: address derives from a 64-bit value loaded "
                      f"from memory on line {load_table} (a pointer read from memory)")


def test_triton_module_header_and_params(triton_ptx):
    module = parse(triton_ptx("add"))
    assert (module.version, module.target, module.address_size) == ("9.4", "sm_90a", 64)
    (entry,) = module.entries
    assert entry.name == "add"
    assert [(p.name, p.type, p.is_pointer_hint) for p in entry.params] == [
        ("add_param_0", ".u64", True), ("add_param_1", ".u64", True), ("add_param_2", ".u64", True),
        ("add_param_3", ".u32", False), ("add_param_4", ".u64", True), ("add_param_5", ".u64", True)]
    (store,) = [i for i in entry.instructions if i.opcode == "st"]
    assert store.predicate == "%p1" and store.modifiers == ("global", "b32")
    assert [op.kind for op in store.operands] == ["address", "vector"]
    assert store.operands[0].base == "%rd3" and store.operands[0].offset == 0


# The *_nvcc*.ptx fixtures are nvcc 13.0 output of tests/data/ptx/cuda/*.cu (commands in each file).


def test_nvcc_saxpy():
    module = parse((PTX / "saxpy_nvcc.ptx").read_text())
    assert (module.version, module.target) == ("9.0", "sm_90")
    (access,) = analyze(module)
    # Scalars (n: u32, a: f32) cannot hold a pointer and are not reported.
    assert access.params == {"_Z5saxpyifPKfPf_param_2": "read", "_Z5saxpyifPKfPf_param_3": "readwrite"}
    assert not access.pinned
    assert access.evidence == [(43, "_Z5saxpyifPKfPf_param_2", "read"),
                               (45, "_Z5saxpyifPKfPf_param_3", "read"),
                               (47, "_Z5saxpyifPKfPf_param_3", "write")]
    assert module.entries[0].labels == {"$L__BB0_2": 19}


def test_nvcc_pointer_chasing_on_sm80_is_pinned():
    (access,) = analyze(parse((PTX / "chase_nvcc_sm80.ptx").read_text()))
    assert access.pinned
    assert access.reasons == ["line 34: ld.global.f32: address derives from a 64-bit value loaded from memory "
                              "on line 32 (a pointer read from memory)"]


def test_nvcc_shared_memory_reduction_with_an_atomic_output():
    (access,) = analyze(parse((PTX / "block_sum_nvcc.ptx").read_text()))
    assert not access.pinned  # shared-memory traffic is not global access
    assert access.params == {"_Z9block_sumPKfPfi_param_0": "read", "_Z9block_sumPKfPfi_param_1": "readwrite"}


def test_global_variable_pins_the_kernel():
    module = parse((PTX / "global_counter_nvcc.ptx").read_text())
    assert [(g.name, g.space, g.line) for g in module.globals] == [("g_counter", "global", 14)]
    (access,) = analyze(module)
    assert access.pinned
    assert access.reasons == ["line 40: atom.global.add.u32: address derives from global variable g_counter"]
    assert access.params == {"_Z5countPKfPf_param_0": "read", "_Z5countPKfPf_param_1": "write"}


def test_handwritten_bulk_vector_generic_and_tensor_map():
    module = parse((PTX / "handwritten_bulk.ptx").read_text())
    (access,) = analyze(module)
    assert access.params == {"src": "read", "dst": "write", "acc": "readwrite", "flags": "write",
                             "spare": "unused", "tmap": "read"}
    assert not access.pinned
    ins = {i.name: i for i in module.entries[0].instructions}
    vec = ins["ld.v4.b32"]
    assert vec.line == 35 and [o.text for o in vec.operands[0].items] == ["%r3", "%r4", "%r5", "%r6"]
    assert ins["st.global.v2.b32"].predicate == "!%p1"
    assert ins["cp.async.bulk.global.shared::cta.bulk_group"].operands[0].offset == -16
    tensor = next(i for n, i in ins.items() if n.startswith("cp.async.bulk.tensor"))
    assert tensor.operands[1].base == "%rd7" and len(tensor.operands[1].items) == 2
    assert module.entries[0].params[-1].array_bytes == 128


def test_tensor_map_from_a_global_pointer_is_pinned():
    ptx = """.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 desc)
{
	.reg .b32 %r<3>;
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [desc];
	cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2}], [%r1];
	ret;
}
"""
    (access,) = analyze(parse(ptx))
    assert access.pinned
    (reason,) = access.reasons
    assert reason == ("line 9: cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes:"
                      " tensor map read from memory; the buffer it names cannot be followed")


HEADER = ".version 8.0\n.target sm_90\n.address_size 64\n"


@pytest.mark.parametrize("body, line, what", [
    (".visible .entry k(.param .u64 p)\n{\n\tret;\n", 5, "unbalanced '{'"),
    (".visible .entry k(.param .u64 p)\n{\n\tret;\n}\n}\n", 8, "unbalanced '}'"),
    (".visible .entry k(.param .u64 p)\n{\n\t.entry inner()\n\tret;\n}\n", 6, "unexpected '.entry'"),
    (".visible .entry k(.param .u64 p)\n{\n\tld.global.f32 %f1, [%rd1 + ];\n}\n", 6, "bad address"),
    (".visible .entry k(.param .u64 p)\n{\n\tadd.s64 %rd1, %rd2 %rd3;\n}\n", 6, "bad operand"),
    (".bogus 3\n", 4, "unexpected '.bogus' at module level"),
])
def test_malformed_ptx_names_the_line(body, line, what):
    with pytest.raises(PtxSyntaxError) as err:
        parse(HEADER + body)
    assert err.value.line == line
    assert str(err.value).startswith(f"PTX line {line}: {what}")
    assert isinstance(err.value, UsageError)


def test_comments_and_debug_sections_are_skipped():
    ptx = HEADER + """/* block
comment */ .visible .entry k( // trailing
	.param .u64 p )
{
	.loc 1 2 3
	ret; // done
}
	.file 1 "k.py"
	.section .debug_info
	{
.b8 1 // data
	}
"""
    (entry,) = parse(ptx).entries
    assert [(i.line, i.name) for i in entry.instructions] == [(9, "ret")]


def test_kernel_work_from_ptx(triton_ptx):
    from kernelfleet.ptx.kinds import kind_of

    def work(name, capability=90):
        return kind_of(parse(triton_ptx(name, capability)).entries[0])

    assert work("matmul") == "tensor-core"  # tl.dot: mma (sm_80) / wgmma (sm_90)
    assert work("matmul", 80) == "tensor-core"
    assert work("add") == "memory-bound" and work("row_sum") == "memory-bound"
    empty = parse(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry nothing()\n{\n ret;\n}\n")
    assert kind_of(empty.entries[0]) == "other"
