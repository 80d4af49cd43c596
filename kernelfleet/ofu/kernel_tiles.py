"""Tile shapes from GEMM kernel names, for the tile-quantization correction.

cuBLAS and CUTLASS put the CTA tile in the kernel name; the profiler gives the
name of the kernel that actually ran. Shapes seen on an H200 (torch 2.11,
cuBLAS 13) in tests/data/h200-sweep:

* ``nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT``: tile 320×128, K step 64 (3 stages),
  thread-block cluster 1×2
* ``sm90_xmma_gemm_..._tilesize128x256x32_warpgroupsize2x1x1_...``: 128×256, K 32
* ``cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4``: 64×64, K 32 (6 stages)
* ``cutlass3x_sm90_tensorop_gemm_..._128x256x64_1x2x1_...``: 128×256, K 64

The tile's first dimension runs along cuBLAS's M, which for a row-major torch
``C[M, N] = A[M, K] @ B[K, N]`` is torch's N: cuBLAS is column-major, so torch
asks it for ``Cᵀ = Bᵀ Aᵀ``.

Clusters. A cluster launch runs all its CTAs, so an nvjet kernel with a 2×4 cluster
computes whole 2×4 groups of tiles: its grid is the tile grid rounded up to the
cluster, ceil(ceil(N / 64) / 2) · 2 · 64 = pad(N, 2 · 64) along the tile's first side.
The cluster's sides follow the tile's (first along cuBLAS M, i.e. torch N). Nsight
Compute checked both on the 30 bf16/fp16 nvjet kernels of the sweep: the counted
tensor ops equal this count to the op, and the other axis assignment misses all seven
kernels where the two differ (tests/replay/test_ncu_sweep.py). CUTLASS 3 names state a
cluster too (``_1x2x1_`` above), but no recorded kernel checks how its grid is
rounded, so only nvjet clusters are applied.
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
# nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT: tile 64×48, K 64, 15 stages, cluster 2×4.
_NVJET_CLUSTER = re.compile(r"nvjet_sm\d+_[a-z]+_\d+x\d+_\d+x\d+_(\d+)x(\d+)_")


def tile_from_kernel_name(name: str) -> Tile | None:
    """The CTA tile (cuBLAS M × N × K step) a GEMM kernel's name states, or None."""
    for pattern in _PATTERNS:
        found = pattern.search(name)
        if found:
            return Tile(*(int(g) for g in found.groups()))
    return None


def cluster_from_kernel_name(name: str) -> tuple[int, int] | None:
    """The thread-block cluster an nvjet name states, along the tile's first and second
    side (cuBLAS M, N), or None (no cluster, or not an nvjet kernel)."""
    found = _NVJET_CLUSTER.search(name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def launch_tile_from_kernel_name(name: str) -> Tile | None:
    """The block the kernel's grid is rounded up to: the CTA tile times its cluster, or None.

    Padding a size to ``tile × cluster`` equals padding it to the tile and then rounding
    the tile count up to the cluster (ceil(ceil(x / t) / c) = ceil(x / (t·c))).
    """
    tile = tile_from_kernel_name(name)
    if tile is None:
        return None
    cm, cn = cluster_from_kernel_name(name) or (1, 1)
    return Tile(tile.m * cm, tile.n * cn, tile.k)


def executed_flops_of_torch_mm(m: int, n: int, k: int, tile: Tile, batch: int = 1) -> int:
    """Executed FLOPs of torch's row-major ``[M, K] @ [K, N]`` on a cuBLAS tile.

    Pads to ``tile`` only; pass ``launch_tile_from_kernel_name(name)`` (or use
    ``executed_flops_of_kernel``) to round to whole clusters as well.
    """
    return executed_gemm_flops(n, m, k, tile, batch)


def executed_flops_of_kernel(m: int, n: int, k: int, name: str, batch: int = 1) -> int | None:
    """Executed FLOPs of torch's ``[M, K] @ [K, N]`` run by the named kernel: M, N, K padded to
    its tile, the tile grid rounded up to whole clusters. None when the name states no tile."""
    tile = launch_tile_from_kernel_name(name)
    return None if tile is None else executed_flops_of_torch_mm(m, n, k, tile, batch)
