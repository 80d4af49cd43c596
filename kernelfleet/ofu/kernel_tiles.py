"""Tile shapes from GEMM kernel names, for the tile-quantization correction.

cuBLAS and CUTLASS put the CTA tile in the kernel name; the profiler gives the
name of the kernel that actually ran. Shapes seen on an H200 (torch 2.11,
cuBLAS 13) in tests/data/h200-sweep:

* ``nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT``: tile 320×128, K step 64 (3 stages)
* ``sm90_xmma_gemm_..._tilesize128x256x32_warpgroupsize2x1x1_...``: 128×256, K 32
* ``cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4``: 64×64, K 32 (6 stages)
* ``cutlass3x_sm90_tensorop_gemm_..._128x256x64_1x2x1_...``: 128×256, K 64

The tile's first dimension runs along cuBLAS's M, which for a row-major torch
``C[M, N] = A[M, K] @ B[K, N]`` is torch's N: cuBLAS is column-major, so torch
asks it for ``Cᵀ = Bᵀ Aᵀ``.
"""

from __future__ import annotations

import re

from kernelfleet.ofu.tiles import Tile, executed_gemm_flops

_PATTERNS = (
    re.compile(r"nvjet_sm\d+_[a-z]+_(\d+)x(\d+)_(\d+)x\d+_"),
    re.compile(r"tilesize(\d+)x(\d+)x(\d+)"),
    re.compile(r"cutlass_\d+_tensorop_\w*?gemm_(\d+)x(\d+)_(\d+)x\d+_"),
    re.compile(r"cutlass3x_\w+?_(\d+)x(\d+)x(\d+)_\d+x\d+x\d+_"),
)


def tile_from_kernel_name(name: str) -> Tile | None:
    """The CTA tile (cuBLAS M × N × K step) a GEMM kernel's name states, or None."""
    for pattern in _PATTERNS:
        found = pattern.search(name)
        if found:
            return Tile(*(int(g) for g in found.groups()))
    return None


def executed_flops_of_torch_mm(m: int, n: int, k: int, tile: Tile, batch: int = 1) -> int:
    """Executed FLOPs of torch's row-major ``[M, K] @ [K, N]`` on a cuBLAS tile."""
    return executed_gemm_flops(n, m, k, tile, batch)
