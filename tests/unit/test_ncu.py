"""Nsight Compute counts on hand-made metrics (validation/ncu.py); the H200 runs are in tests/replay/test_ncu_sweep.py."""

import pytest

from kernelfleet.telemetry.ncu import NcuKernel
from kernelfleet.validation.ncu import executed_ops, merge_runs, ncu_point

pytestmark = pytest.mark.unit
KERNEL2 = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(Params)"
METRICS = {"sm__pipe_tensor_cycles_active.sum": 4.0 * 132, "sm__cycles_elapsed.avg": 2.0,
           "sm__cycles_elapsed.avg.per_second": 1.8e9, "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum": 7.0}


def test_fp8_ops_from_the_split_totals_never_twice():
    split = {"sm__ops_path_tensor_src_fp8_dst_fp16.sum": 3.0, "sm__ops_path_tensor_src_fp8_dst_fp32.sum": 5.0}
    assert executed_ops("fp8", split) == 8
    assert executed_ops("fp8", {**split, "sm__ops_path_tensor_src_fp8.sum": 8.0}) == 8
    assert executed_ops("fp64", split) is None


def test_a_kernel2_named_by_its_base_name_takes_its_tile_from_the_sweeps_name():
    point = {"m": 200, "n": 200, "k": 200, "precision": "tf32"}
    counted = ncu_point(point, NcuKernel("Kernel2", "(4, 4, 1)", METRICS), 132, model_name=KERNEL2)
    assert counted.executed_ops == 7 and counted.tile is not None and (counted.tile.m, counted.tile.n) == (64, 64)
    assert counted.name_executed_flops == 2 * 256 * 256 * 224 and counted.kernel == "Kernel2"


def test_a_later_run_replaces_an_earlier_runs_point():
    def point(m, ops):
        return ncu_point({"m": m, "n": m, "k": m, "precision": "tf32"},
                         NcuKernel("Kernel2", "", {**METRICS, "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum": ops}),
                         132, model_name=KERNEL2)

    first, again, new = point(256, 7.0), point(256, 9.0), point(512, 5.0)
    assert merge_runs([first], [again, new]) == [again, new]
    assert merge_runs([first, new], []) == [first, new]
