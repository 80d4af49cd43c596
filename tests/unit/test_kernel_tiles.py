"""Tile shapes parsed from the names of kernels that ran on an H200 (tests/data/h200-sweep)."""

import pytest

from kernelfleet.ofu import Tile
from kernelfleet.ofu.kernel_tiles import executed_flops_of_torch_mm, tile_from_kernel_name

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "name, tile",
    [
        ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", Tile(320, 128, 64)),
        ("nvjet_sm90_hsh_128x72_64x8_4x2_h_bz_NNT", Tile(128, 72, 64)),
        ("nvjet_sm90_qqtst_144x128_128x6_1x2_h_bz_coopA_algo2_TNN", Tile(144, 128, 128)),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
         Tile(128, 256, 32)),
        ("sm90_xmma_gemm_f64f64_f64f64_f64_nn_n_tilesize128x64x16_stage3_warpsize2x2x1_tensor16x8x8_execute_kernel__5x_cublas",
         Tile(128, 64, 16)),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4::Params)",
         Tile(64, 64, 32)),
        ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8_warpspecialized_cooperative",
         Tile(128, 256, 64)),
        ("Memset (Device)", None),
        ("triton_poi_fused_add_0", None),
    ],
)
def test_tile_from_kernel_name(name, tile):
    assert tile_from_kernel_name(name) == tile


def test_torch_row_major_maps_the_tile_m_to_torch_n():
    tile = Tile(320, 128, 64)
    # torch [4096 x 4096] @ [4096 x 14336]: cuBLAS M = 14336 on the 320 side, N = 4096 on the 128 side
    assert executed_flops_of_torch_mm(4096, 14336, 4096, tile) == 2 * 14400 * 4096 * 4096
