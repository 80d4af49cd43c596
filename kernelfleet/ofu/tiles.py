"""Tile-quantization correction.

A GEMM kernel computes whole tiles: an M×N×K problem on BM×BN×BK tiles keeps the
tensor pipe busy for ceil(M/BM)·BM × ceil(N/BN)·BN × ceil(K/BK)·BK multiply-adds,
of which only M·N·K are useful. OFU counts the padded work (the pipe was busy),
so it over-states MFU on shapes that are not tile multiples:

    OFU_adj = OFU × useful_flops / executed_flops
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernelfleet.errors import UsageError


@dataclass(frozen=True, slots=True)
class Tile:
    m: int
    n: int
    k: int

    def __post_init__(self) -> None:
        if min(self.m, self.n, self.k) <= 0:
            raise UsageError(f"tile sizes must be positive, got {self.m}x{self.n}x{self.k}")


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> int:
    """Useful FLOPs of ``batch`` M×N×K GEMMs: one multiply and one add per MAC."""
    if min(m, n, k, batch) <= 0:
        raise UsageError(f"GEMM sizes must be positive, got batch={batch} {m}x{n}x{k}")
    return 2 * batch * m * n * k


def executed_gemm_flops(m: int, n: int, k: int, tile: Tile, batch: int = 1) -> int:
    """FLOPs the tensor pipe executes when every partial tile is computed whole."""
    gemm_flops(m, n, k, batch)  # validates
    pad = lambda size, step: math.ceil(size / step) * step  # noqa: E731
    return 2 * batch * pad(m, tile.m) * pad(n, tile.n) * pad(k, tile.k)


def tile_efficiency(m: int, n: int, k: int, tile: Tile) -> float:
    """useful / executed FLOPs, in (0, 1]."""
    return gemm_flops(m, n, k) / executed_gemm_flops(m, n, k, tile)


def corrected_ofu(ofu_ratio: float, useful_flops: float, executed_flops: float) -> float:
    """OFU with padded tile work removed (sum useful and executed over a window's GEMMs)."""
    if executed_flops <= 0 or useful_flops < 0 or useful_flops > executed_flops:
        raise UsageError(
            f"need 0 <= useful <= executed FLOPs, got useful={useful_flops} executed={executed_flops}"
        )
    return ofu_ratio * useful_flops / executed_flops
