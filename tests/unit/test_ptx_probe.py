"""The dynamic range probe rewriter (ptx.probe): the rewritten PTX assembles with the real ptxas
shipped with Triton, every global access gets a site (counted here by regex, not by the probe's own
code), nothing of the original changes, and decode() reads a probe buffer back into byte ranges,
including one recorded on an H200."""

import re
import struct
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.ptx import parse
from kernelfleet.ptx.probe import ProbeSite, decode, initial_probe_bytes, instrument

pytestmark = pytest.mark.unit
PTX = Path(__file__).parents[1] / "data" / "ptx"
FIXTURES = sorted(p.name for p in PTX.glob("*.ptx"))
TRITON = ["add", "add_inplace", "row_sum", "histogram", "matmul", "matmul_tma", "gather_ptr"]

# One global memory instruction per match, at the start of its line (after an optional label or
# `{`): an access in the global space, a cp.async from global, a bulk copy with a global side that
# is not through a tensor map, Triton's copy of a tensor map out to global scratch, or a generic
# ld/st/atom/red (in these kernels every generic access goes through a pointer parameter).
GLOBAL_ACCESS = re.compile(r"""^[ \t]*(?:[$\w]+:[ \t]*)?(?:\{[ \t]*)?(?:@!?%\w+[ \t]+)?(?:
      (?:ld|ldu|st|atom|red)(?:\.[\w:]+)*?\.global\b
    | cp\.async\.c[ag]\.shared(?:::cta)?\.global\b
    | cp\.(?:reduce\.)?async\.bulk\.(?!tensor|prefetch|commit|wait)[\w.:]*\bglobal\b
    | tensormap\.cp_fenceproxy\.global\b
    | (?:ld|st|atom|red)(?:\.(?!global|shared|param|local|const)[\w:]+)+[ \t]
)""", re.VERBOSE | re.MULTILINE)
TENSOR_COPY = re.compile(r"^[ \t]*(?:@!?%\w+[ \t]+)?cp\.(?:reduce\.)?async\.bulk\.tensor", re.MULTILINE)


@pytest.fixture(scope="session")
def triton_ptx():
    pytest.importorskip("triton")
    import ptx_kernels

    cache: dict[tuple[str, int], str] = {}

    def get(name: str, capability: int) -> str:
        if (name, capability) not in cache:
            cache[name, capability] = ptx_kernels.compile_ptx(name, capability)
        return cache[name, capability]

    return get


def without_probes(ptx: str, original: str, param: str) -> str:
    """The rewritten text with every instruction and `.reg` line that names a register the original
    lacks (the probe's) cut out, and the probe parameter dropped: what is left must be the original."""
    new_names = set(re.findall(r"%[\w$]+", ptx)) - set(re.findall(r"%[\w$]+", original))
    assert new_names and param not in original
    entry = next(e for e in parse(ptx).entries if param in [p.name for p in e.params])
    cuts = [(ins.start, ptx.index(";", ins.start) + 1) for ins in entry.instructions]
    for start, end in reversed(cuts):
        if any(name in ptx[start:end] for name in new_names):
            ptx = ptx[:start] + ptx[end:]
    ptx = re.sub(r"\.reg\s+\.\w+\s+(%[\w$]+)(?:<\d+>)?;", lambda m: "" if m[1] not in original else m[0], ptx)
    return re.sub(rf",?\s*\.param\s+\.u64\s+{param}\b", "", ptx)


def probe_code(ptx: str, original: str, entry: str) -> list[list[str]]:
    """The statements of each run of probe code in `entry`, in order (the prologue included)."""
    new_names = set(re.findall(r"%[\w$]+", ptx)) - set(re.findall(r"%[\w$]+", original))
    runs: list[list[str]] = [[]]
    for ins in next(e for e in parse(ptx).entries if e.name == entry).instructions:
        text = ptx[ins.start:ptx.index(";", ins.start) + 1]
        if any(name in text for name in new_names):
            runs[-1].append(text)
        elif runs[-1]:
            runs.append([])
    return runs[:-1]


def check_rewrite(text: str, entry: str, ptxas, tmp_path: Path):
    kernel = instrument(text, entry)
    assert ptxas(kernel.ptx, tmp_path) == ""
    expected_lines = [text[:m.start()].count("\n") + 1 for m in GLOBAL_ACCESS.finditer(text)]
    assert [s.line for s in kernel.sites] == expected_lines
    assert [s.index for s in kernel.sites] == list(range(len(expected_lines)))
    lines = text.splitlines()
    assert all(s.opcode in lines[s.line - 1] for s in kernel.sites)
    tensor_lines = [text[:m.start()].count("\n") + 1 for m in TENSOR_COPY.finditer(text)]
    assert [int(u.split(":")[0].split()[1]) for u in kernel.unprobed] == tensor_lines
    # The original, character for character (up to whitespace), with only the probe added.
    assert without_probes(kernel.ptx, text, kernel.probe_param).split() == text.split()
    (orig,), (new,) = parse(text).entries, parse(kernel.ptx).entries
    assert [p.name for p in new.params] == [p.name for p in orig.params] + [kernel.probe_param]
    assert kernel.probe_bytes == 16 * len(kernel.sites)
    return kernel


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_rewrite_assembles_and_probes_every_global_access(name, ptxas, tmp_path):
    text = (PTX / name).read_text()
    (entry,) = parse(text).entries
    check_rewrite(text, entry.name, ptxas, tmp_path)


@pytest.mark.parametrize("capability", [80, 90])
@pytest.mark.parametrize("name", TRITON)
def test_triton_rewrite_assembles_and_probes_every_global_access(name, capability, triton_ptx, ptxas,
                                                                   tmp_path):
    check_rewrite(triton_ptx(name, capability), name, ptxas, tmp_path)


def test_site_counts_of_the_fixtures_by_hand():
    # Counted by reading the files, so a regex mistake above cannot hide a miss.
    counts = {"block_sum_nvcc.ptx": (2, 0), "chase_nvcc_sm80.ptx": (3, 0), "global_counter_nvcc.ptx": (3, 0),
              "handwritten_bulk.ptx": (5, 1), "saxpy_nvcc.ptx": (3, 0)}
    for name, (sites, unprobed) in counts.items():
        text = (PTX / name).read_text()
        kernel = instrument(text, parse(text).entries[0].name)
        assert (len(kernel.sites), len(kernel.unprobed)) == (sites, unprobed), name


def test_sites_of_the_handwritten_bulk_kernel():
    kernel = instrument((PTX / "handwritten_bulk.ptx").read_text(), "bulk")
    assert kernel.sites == (
        ProbeSite(0, 35, "ld.v4.b32", "read", 16, ("src",)),
        ProbeSite(1, 38, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes", "read", 256,
                  ("src",)),
        ProbeSite(2, 39, "cp.async.bulk.global.shared::cta.bulk_group", "write", 256, ("dst",)),
        ProbeSite(3, 40, "red.global.add.f32", "readwrite", 4, ("acc",)),
        ProbeSite(4, 41, "st.global.v2.b32", "write", 8, ("flags",)))
    (reason,) = kernel.unprobed
    assert reason.startswith("line 44: cp.async.bulk.tensor.2d.") and "tensor map" in reason


def probe_statements_before(ptx: str, entry: str, opcode_prefix: str):
    """For each instruction whose name starts with opcode_prefix: (its predicate, the predicates of
    the probe atomics just before it)."""
    instructions = next(e for e in parse(ptx).entries if e.name == entry).instructions
    out = []
    for k, ins in enumerate(instructions):
        if ins.name.startswith(opcode_prefix):
            before = []
            for prev in reversed(instructions[:k]):
                if not prev.name.startswith("red.global.m"):
                    break
                before.append(prev.predicate)
            out.append((ins.predicate, before))
    return out


def test_predicated_accesses_are_probed_under_the_same_predicate(triton_ptx):
    kernel = instrument(triton_ptx("add", 90), "add")
    pairs = probe_statements_before(kernel.ptx, "add", "ld.global") + \
        probe_statements_before(kernel.ptx, "add", "st.global")
    assert pairs == [("%p1", ["%p1", "%p1"])] * 3
    bulk = instrument((PTX / "handwritten_bulk.ptx").read_text(), "bulk")
    assert probe_statements_before(bulk.ptx, "bulk", "st.global") == [("!%p1", ["!%p1", "!%p1"])]
    assert probe_statements_before(bulk.ptx, "bulk", "red.global.add") == [(None, [None, None])]


def test_masked_cp_async_records_only_the_bytes_it_copies(triton_ptx):
    # Triton masks cp.async with src-size 0 (`selp.b32 %r, 16, 0, %p`): such a copy reads nothing,
    # so its probe must be guarded by the size, not recorded unconditionally.
    kernel = instrument(triton_ptx("matmul", 90), "matmul")
    assert {s.opcode for s in kernel.sites} == {"cp.async.cg.shared.global", "st.global.v4.b32"}
    guarded = [pred for _, pred in probe_statements_before(kernel.ptx, "matmul", "cp.async.cg")]
    assert guarded and all(p == [p[0], p[0]] and p[0] and "probe" in p[0] for p in guarded)


def test_tensor_copies_are_listed_and_tensor_map_writes_probed(triton_ptx):
    text = triton_ptx("matmul_tma", 90)
    kernel = instrument(text, "matmul_tma")
    tensor_lines = [text[:m.start()].count("\n") + 1 for m in TENSOR_COPY.finditer(text)]
    assert len(tensor_lines) == 7
    assert [u.split(":")[0] for u in kernel.unprobed] == [f"line {n}" for n in tensor_lines]
    assert all("tensor map" in u for u in kernel.unprobed)
    # Triton writes each 128-byte tensor map to its global scratch (hidden param 6).
    assert [(s.mode, s.width_bytes, s.params) for s in kernel.sites] == \
        [("write", 128, ("matmul_tma_param_6",))] * 3


def raw(*slots: tuple[int, int]) -> bytes:
    return b"".join(struct.pack("<QQ", low, high) for low, high in slots)


def test_decode_handcrafted_buffer():
    kernel = instrument((PTX / "handwritten_bulk.ptx").read_text(), "bulk")
    never = (2**64 - 1, 0)
    buf = raw((0x1000, 0x10F0), (0x2000, 0x2000), never, (0x3000, 0x3000), (0x4008, 0x4FF8))
    assert [(s.index, lo, hi) for s, lo, hi in decode(kernel, buf)] == [
        (0, 0x1000, 0x1100), (1, 0x2000, 0x2100), (2, None, None), (3, 0x3000, 0x3004), (4, 0x4008, 0x5000)]
    assert initial_probe_bytes(kernel) == raw(*[never] * 5)
    assert all(lo is None and hi is None for _, lo, hi in decode(kernel, initial_probe_bytes(kernel)))


@pytest.mark.parametrize("buf, message", [
    (b"\0" * 79, "must be 80 bytes, got 79"),
    (raw((2**64 - 1, 0x10), *[(1, 1)] * 4), "probe slot 0 (line 35) has only one bound set"),
])
def test_decode_rejects_a_buffer_of_another_kernel(buf, message):
    kernel = instrument((PTX / "handwritten_bulk.ptx").read_text(), "bulk")
    with pytest.raises(UsageError, match=re.escape(message)):
        decode(kernel, buf)


def test_unknown_entry_is_a_one_line_usage_error():
    with pytest.raises(UsageError) as err:
        instrument((PTX / "saxpy_nvcc.ptx").read_text(), "saxpy")
    assert str(err.value) == "no kernel entry 'saxpy' in the PTX (entries: _Z5saxpyifPKfPf)"


def test_32_bit_module_is_a_usage_error():
    text = (PTX / "saxpy_nvcc.ptx").read_text().replace(".address_size 64", ".address_size 32")
    with pytest.raises(UsageError, match="needs .address_size 64, the PTX has 32"):
        instrument(text, "_Z5saxpyifPKfPf")


def test_new_names_avoid_names_already_in_the_module(ptxas, tmp_path):
    # A kernel that already uses the names the probe would pick, for a register and a parameter.
    first = instrument((PTX / "saxpy_nvcc.ptx").read_text(), "_Z5saxpyifPKfPf")
    register = re.search(r"\.reg \.b64 (%\w+?)<", first.ptx.split("{", 1)[1])[1]
    text = (PTX / "saxpy_nvcc.ptx").read_text().replace("%rd", register)
    text = text.replace("_Z5saxpyifPKfPf_param_3", first.probe_param)
    kernel = instrument(text, "_Z5saxpyifPKfPf")
    assert kernel.probe_param != first.probe_param and first.probe_param in kernel.probe_param
    assert ptxas(kernel.ptx, tmp_path) == ""
    assert len(kernel.sites) == 3


def test_entry_without_a_parameter_list(ptxas, tmp_path):
    text = ".version 8.0\n.target sm_90\n.address_size 64\n.global .u32 g;\n" \
           ".visible .entry k\n{\n\t.reg .b32 %r<2>;\n\tst.global.u32 [g+0], 1;\n\tret;\n}\n"
    kernel = instrument(text, "k")
    assert ptxas(kernel.ptx, tmp_path) == ""
    assert [p.name for p in parse(kernel.ptx).entries[0].params] == [kernel.probe_param]
    assert [(s.line, s.params) for s in kernel.sites] == [(8, ())]


# Hand-written for the probe, then run once on an NVIDIA H200 (driver 580.159.04): the rewritten
# `edges` assembled with Triton's ptxas-blackwell for sm_90, loaded through the CUDA driver and
# launched as one block of 64 threads with src and dst 4096-byte buffers. RECORDED holds the buffer
# addresses and the probe buffer read back afterwards.
EDGES = """// Edge cases for the probe: labels and scopes on the instruction's line, negative offsets,
// a generic store that may hit shared memory, predicates (plain and negated), a variable's
// address, cp.async with ignore-src and with a register src-size, a bulk copy sized by a
// register, an absolute address, a call, and a second entry that must stay untouched.
.version 8.0
.target sm_90
.address_size 64

.global .align 8 .u32 g_slots[4];

.func store_one(.param .u64 where)
{
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [where];
	st.global.u32 [%rd1], 1;
	ret;
}

.visible .entry edges(
	.param .u64 src, // the input
	.param .u64 dst
)
.maxnreg 64
.reqntid 64
{
	.reg .pred %p<5>;
	.reg .b32 %r<9>;
	.reg .b64 %rd<16>;
	.reg .f32 %f<2>;
	.shared .align 16 .b8 tile[1024];
	.pragma "nounroll";

	ld.param.u64 %rd1, [src];
	ld.param.u64 %rd2, [dst];
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mov.u32 %r1, %tid.x;
	setp.lt.u32 %p1, %r1, 32;
	and.b32 %r2, %r1, 1;
	setp.eq.u32 %p2, %r2, 1;
	setp.gt.u32 %p3, %r1, 1000;
	setp.eq.u32 %p4, %r1, 0;
	mul.wide.u32 %rd5, %r1, 4;
	add.s64 %rd6, %rd3, %rd5;
	add.s64 %rd6, %rd6, 4;
$L__read: @%p1 ld.global.f32 %f1, [%rd6+-4];
	mov.u64 %rd7, tile;
	cvta.shared.u64 %rd7, %rd7;
	cvta.global.u64 %rd8, %rd2;
	add.s64 %rd8, %rd8, %rd5;
	selp.b64 %rd9, %rd8, %rd7, %p1;
	{ st.f32 [%rd9], %f1; }
	mul.wide.u32 %rd10, %r1, 8;
	add.s64 %rd10, %rd4, %rd10;
	@!%p1 st.global.v2.f32 [%rd10+8], {%f1, %f1};
	atom.global.add.u32 %r3, [g_slots+8], 1;
	mov.u32 %r4, tile;
	mul.lo.u32 %r5, %r1, 16;
	add.u32 %r5, %r4, %r5;
	cp.async.ca.shared.global [%r5], [%rd6], 4, %p2;
	mul.wide.u32 %rd11, %r1, 16;
	add.s64 %rd11, %rd3, %rd11;
	and.b32 %r6, %r1, 15;
	cp.async.cg.shared.global [%r5], [%rd11], 16, %r6;
	cp.async.wait_all;
	bar.sync 0;
	fence.proxy.async.shared::cta;
	mov.u32 %r7, 64;
	add.s64 %rd12, %rd4, 1024;
	@%p4 cp.async.bulk.global.shared::cta.bulk_group [%rd12], [%r4], %r7;
	@%p4 cp.async.bulk.commit_group;
	@%p4 cp.async.bulk.wait_group 0;
	@%p3 ld.global.u32 %r8, [%rd3+4096];
	add.s64 %rd13, %rd4, 2048;
	{
	.reg .b64 %param_where;
	.param .b64 param0;
	st.param.b64 [param0], %rd13;
	@%p4 call.uni store_one, (param0);
	}
	ret;
}

.visible .entry other(.param .u64 p)
{
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [p];
	st.global.u32 [%rd1], 7;
	ret;
}
"""
RECORDED_BASES = {"src": 139612483747840, "dst": 139612483751936, "g_slots": 139612406153216}
RECORDED_PROBE = bytes.fromhex(
    "00008010fa7e00007c008010fa7e000000108010fa7e00007c108010fa7e0000"
    "08118010fa7e000000128010fa7e00000800e00bfa7e00000800e00bfa7e0000"
    "04008010fa7e0000fc008010fa7e000010008010fa7e0000ef038010fa7e0000"
    "00148010fa7e00003f148010fa7e0000ffffffffffffffff0000000000000000")


def test_edge_cases_rewrite(ptxas, tmp_path):
    kernel = instrument(EDGES, "edges")
    assert ptxas(kernel.ptx, tmp_path) == ""
    assert [(s.line, s.opcode, s.mode, s.width_bytes, s.params) for s in kernel.sites] == [
        (46, "ld.global.f32", "read", 4, ("src",)),  # `$L__read: @%p1 ld.global.f32 %f1, [%rd6+-4];`
        (52, "st.f32", "write", 4, ("dst",)),  # generic, inside `{ ... }` on its line
        (55, "st.global.v2.f32", "write", 8, ("dst",)),  # `@!%p1`, `[%rd10+8]`
        (56, "atom.global.add.u32", "readwrite", 4, ()),  # `[g_slots+8]`: a variable, no parameter
        (60, "cp.async.ca.shared.global", "read", 4, ("src",)),  # ignore-src predicate
        (64, "cp.async.cg.shared.global", "read", 16, ("src",)),  # src-size in a register
        (70, "cp.async.bulk.global.shared::cta.bulk_group", "write", 1, ("dst",)),  # size in a register
        (73, "ld.global.u32", "read", 4, ("src",))]  # never taken
    assert kernel.unprobed == ("line 79: call.uni: accesses inside store_one are not probed",)
    assert without_probes(kernel.ptx, EDGES, kernel.probe_param).split() == EDGES.split()
    other = EDGES[EDGES.index(".visible .entry other"):]
    assert kernel.ptx.endswith(other)  # the other entry is kept as it was
    assert "$L__read: add.s64" in kernel.ptx  # the label still leads to the probe of its load


def test_edge_case_probe_code():
    kernel = instrument(EDGES, "edges")
    d0, d1, d2, d3, p = "%kf_probe_d0", "%kf_probe_d1", "%kf_probe_d2", "%kf_probe_d3", "%kf_probe_p"

    def minmax(at: str, index: int, low: str, high: str | None = None) -> list[str]:
        return [f"{at}red.global.min.u64 [{d0}+{16 * index}], {low};",
                f"{at}red.global.max.u64 [{d0}+{16 * index + 8}], {high or low};"]

    assert probe_code(kernel.ptx, EDGES, "edges") == [
        [f"ld.param.u64 {d0}, [edges_kf_probe];", f"cvta.to.global.u64 {d0}, {d0};"],
        [f"add.s64 {d1}, %rd6, -4;", *minmax("@%p1 ", 0, d1)],
        [f"isspacep.global {p}, %rd9;", *minmax(f"@{p} ", 1, "%rd9")],
        [f"add.s64 {d1}, %rd10, 8;", *minmax("@!%p1 ", 2, d1)],
        [f"mov.u64 {d1}, g_slots;", f"add.s64 {d1}, {d1}, 8;", *minmax("", 3, d1)],
        minmax("@!%p2 ", 4, "%rd6"),  # ignore-src %p2: read only when it is false
        # src-size %r6: nothing read when 0; else the max slot gets addr + size - 16 (decode adds 16).
        [f"setp.ne.u32 {p}, %r6, 0;", f"cvt.u64.u32 {d3}, %r6;", f"add.s64 {d2}, %rd11, {d3};",
         f"add.s64 {d2}, {d2}, -16;", *minmax(f"@{p} ", 5, "%rd11", d2)],
        [f"setp.ne.u32 {p}, %r7, 0;", f"cvt.u64.u32 {d3}, %r7;", f"add.s64 {d2}, %rd12, {d3};",
         f"add.s64 {d2}, {d2}, -1;", f"and.pred {p}, {p}, %p4;", *minmax(f"@{p} ", 6, "%rd12", d2)],
        [f"add.s64 {d1}, %rd3, 4096;", *minmax("@%p3 ", 7, d1)]]
    # Probe code inside a nested scope keeps the scope's indentation.
    bulk = instrument((PTX / "handwritten_bulk.ptx").read_text(), "bulk").ptx
    assert "\n\t\t@%kf_probe_p red.global.max.u64 [%kf_probe_d0+8], %rd6;\n\t\tld.v4.b32" in bulk


def test_generic_access_is_probed_unless_it_provably_is_shared(ptxas, tmp_path):
    text = """.version 8.0
.target sm_90
.address_size 64
.visible .entry g(.param .u64 p)
{
	.reg .b32 %r<4>;
	.reg .b64 %rd<5>;
	.shared .align 4 .b8 buf[64];
	ld.param.u64 %rd1, [p];
	mov.u64 %rd2, buf;
	cvta.shared.u64 %rd3, %rd2;
	ld.u32 %r1, [%rd3+4];
	ld.u32 %r2, [buf];
	ld.global.u64 %rd4, [%rd1];
	st.u32 [%rd4], %r1;
	ret;
}
"""
    kernel = instrument(text, "g")
    assert ptxas(kernel.ptx, tmp_path) == ""
    # The shared loads are not sites; the store through a pointer read from memory may hit any
    # space, so it is probed and guarded by isspacep.global at run time.
    assert [(s.line, s.opcode, s.params) for s in kernel.sites] == \
        [(14, "ld.global.u64", ("p",)), (15, "st.u32", ())]
    assert probe_code(kernel.ptx, text, "g")[-1][0] == "isspacep.global %kf_probe_p, %rd4;"


def test_recorded_h200_probe_buffer_decodes_to_the_bytes_each_access_reached():
    kernel = instrument(EDGES, "edges")
    bases = sorted(RECORDED_BASES.items(), key=lambda kv: kv[1])

    def where(address):
        if address is None:
            return None
        name, base = [kv for kv in bases if kv[1] <= address][-1]
        return f"{name}+{address - base}"

    assert [(where(lo), where(hi)) for _, lo, hi in decode(kernel, RECORDED_PROBE)] == [
        ("src+0", "src+128"),  # threads 0..31 read src[tid] through [%rd6+-4]
        ("dst+0", "dst+128"),  # threads 0..31 store to dst; threads 32..63 to shared memory: not recorded
        ("dst+264", "dst+520"),  # threads 32..63 (the negated predicate) store 8 bytes at 8 * tid + 8
        ("g_slots+8", "g_slots+12"),
        ("src+4", "src+256"),  # even threads only: odd ones set ignore-src
        ("src+16", "src+1023"),  # src-size tid & 15 at 16 * tid: thread 0 copies nothing, 63 copies 15
        ("dst+1024", "dst+1088"),  # thread 0's 64-byte bulk copy
        (None, None)]
