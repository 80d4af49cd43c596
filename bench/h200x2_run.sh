#!/usr/bin/env bash
# Two-GPU device call (kind nvidia-h200-x2) for the see half: the sampler's per-GPU cost with two
# GPUs, idle and under load, and the data-parallel regression case recorded for the detector.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/kf-x2}
nvidia-smi -L
python3 -m bench.sampler_cost --windows 8 --load-seconds 45
python3 -m bench.record_ddp_regression --out "$OUT/ddp" --clean 40 --slow 40
