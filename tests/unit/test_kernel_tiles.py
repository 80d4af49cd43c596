"""Tile shapes parsed from the names of kernels that ran on an H200 (tests/data/h200-sweep)."""

import pytest

from kernelfleet.ofu import Tile
from kernelfleet.ofu.kernel_tiles import (
    cluster_from_kernel_name,
    executed_flops_of_kernel,
    executed_flops_of_torch_mm,
    launch_tile_from_kernel_name,
    tile_from_kernel_name,
)

pytestmark = pytest.mark.unit
XMMA_TF32 = ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_"
             "kernel__5x_cublas")
CUTLASS3 = "cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8_warpspecialized_cooperative"


@pytest.mark.parametrize(
    "name, tile",
    [
        ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", Tile(320, 128, 64)),
        ("nvjet_sm90_hsh_128x72_64x8_4x2_h_bz_NNT", Tile(128, 72, 64)),
        ("nvjet_sm90_qqtst_144x128_128x6_1x2_h_bz_coopA_algo2_TNN", Tile(144, 128, 128)),
        (XMMA_TF32, Tile(128, 256, 32)),
        ("sm90_xmma_gemm_f64f64_f64f64_f64_nn_n_tilesize128x64x16_stage3_warpsize2x2x1_tensor16x8x8_execute_kernel__5x_cublas",
         Tile(128, 64, 16)),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4::Params)",
         Tile(64, 64, 32)),
        (CUTLASS3, Tile(128, 256, 64)),
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


@pytest.mark.parametrize(
    "name, cluster",
    [
        ("nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT", (2, 4)),
        ("nvjet_sm90_hsh_128x72_64x8_4x2_h_bz_NNT", (4, 2)),
        ("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN", (2, 1)),
        ("nvjet_sm90_qqtst_144x128_128x6_1x2_h_bz_coopA_algo2_TNN", (1, 2)),
        (XMMA_TF32, None),  # warpgroupsize is not a cluster
        (CUTLASS3, None),  # states a cluster, but no recorded kernel checks its rounding
        ("Memset (Device)", None),
    ],
)
def test_cluster_from_kernel_name(name, cluster):
    assert cluster_from_kernel_name(name) == cluster


def test_launch_tile_is_the_tile_times_its_cluster():
    assert launch_tile_from_kernel_name("nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT") == Tile(128, 192, 64)
    assert launch_tile_from_kernel_name(XMMA_TF32) == Tile(128, 256, 32)
    assert launch_tile_from_kernel_name("triton_poi_fused_add_0") is None


def test_a_cluster_rounds_the_tile_grid_up_to_whole_clusters():
    # 200^3 on a 64x8 tile with a 2x4 cluster: torch N 200 -> 4 tiles of 64, 2 clusters (256);
    # torch M 200 -> 25 tiles of 8, launched as 7 clusters of 4 = 28 tiles (224), not 25 (200)
    name = "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT"
    assert executed_flops_of_kernel(200, 200, 200, name) == 2 * 256 * 224 * 256
    assert executed_flops_of_torch_mm(200, 200, 200, tile_from_kernel_name(name)) == 2 * 256 * 200 * 256
    # the cluster follows the tile's sides: 4x2 on 128x72 pads torch N to 512 and torch M to 144
    assert executed_flops_of_kernel(1000, 1000, 1000, "nvjet_sm90_hsh_128x72_64x8_4x2_h_bz_NNT") == 2 * 1024 * 1008 * 1024
    # no cluster: the tile padding alone, and batches multiply
    assert executed_flops_of_kernel(8200, 8200, 8200, XMMA_TF32, batch=3) == 3 * 2 * 8320 * 8448 * 8224
    assert executed_flops_of_kernel(8, 8, 8, "Memset (Device)") is None
