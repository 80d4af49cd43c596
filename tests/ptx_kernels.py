"""Triton kernels compiled to sm_90 PTX by the PTX tests (no GPU needed to compile).

`@triton.jit` needs the source of a real file, so the kernels live here rather than in the test.
Each entry of KERNELS maps a name to (function, signature, constexprs); DIVISIBLE names the kernels
compiled with every argument marked 16-divisible, which is what lets Triton emit `cp.async`.
"""

import warnings

import triton
import triton.language as tl


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def add_inplace(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def row_sum(inp, out, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    vals = tl.load(inp + row * stride + cols, mask=cols < n_cols, other=0.0)
    tl.store(out + row, tl.sum(vals, axis=0))


@triton.jit
def histogram(x, counts, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    bins = tl.load(x + offs, mask=mask, other=0)
    tl.atomic_add(counts + bins, 1, mask=mask)


@triton.jit
def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # Strides are baked in (row-major, contiguous) so the loads are plain pointer blocks, which
    # Triton pipelines with cp.async on sm_80/sm_90.
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        av = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        bv = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(av, bv)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


@triton.jit
def matmul_tma(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # Host-free tensor descriptors: on sm_90 Triton lowers these to cp.async.bulk.tensor (TMA).
    a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(a_desc.load([pm * BM, k]), b_desc.load([k, pn * BN]))
    c_desc.store([pm * BM, pn * BN], acc.to(tl.float16))


@triton.jit
def gather_ptr(table, out, n, BLOCK: tl.constexpr):
    # Pointer chasing: the address of the second load is itself loaded from memory.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    addr = tl.load(table + offs, mask=mask, other=0)
    vals = tl.load(addr.to(tl.pointer_type(tl.float32)), mask=mask, other=0.0)
    tl.store(out + offs, vals, mask=mask)


_MM = {"a": "*fp16", "b": "*fp16", "c": "*fp16", "M": "i32", "N": "i32", "K": "i32"}
_MM_TILE = {"BM": 128, "BN": 128, "BK": 64}

KERNELS = {
    "add": (add, {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}, {"BLOCK": 128}),
    "add_inplace": (add_inplace, {"x": "*fp32", "y": "*fp32", "n": "i32"}, {"BLOCK": 128}),
    "row_sum": (row_sum, {"inp": "*fp32", "out": "*fp32", "n_cols": "i32", "stride": "i32"},
                {"BLOCK": 256}),
    "histogram": (histogram, {"x": "*i32", "counts": "*i32", "n": "i32"}, {"BLOCK": 128}),
    "matmul": (matmul, _MM, _MM_TILE),
    "matmul_tma": (matmul_tma, _MM, _MM_TILE),
    "gather_ptr": (gather_ptr, {"table": "*i64", "out": "*fp32", "n": "i32"}, {"BLOCK": 128}),
}


DIVISIBLE = {"matmul"}


def compile_ptx(name: str, capability: int = 90) -> str:
    """Compile one kernel of KERNELS for sm_<capability> and return its PTX text."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constexprs = KERNELS[name]
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(signature))} if name in DIVISIBLE else None
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_stages": 3}
    with warnings.catch_warnings():
        # Triton 3.9 warns that its FP-fusion default will change; the PTX we test is unaffected.
        warnings.simplefilter("ignore", UserWarning)
        return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options).asm["ptx"]
