"""Pure maths on samples: OFU, FLOP/s estimates, tile correction, aggregation, bottlenecks."""

from kernelfleet.ofu.bottleneck import Bottleneck, classify
from kernelfleet.ofu.core import FlopsEstimate, OfuReading, achieved_flops, ofu, ofu_ratio
from kernelfleet.ofu.tiles import Tile, corrected_ofu, executed_gemm_flops, gemm_flops, tile_efficiency

__all__ = [
    "Bottleneck",
    "FlopsEstimate",
    "OfuReading",
    "Tile",
    "achieved_flops",
    "classify",
    "corrected_ofu",
    "executed_gemm_flops",
    "gemm_flops",
    "ofu",
    "ofu_ratio",
    "tile_efficiency",
]
