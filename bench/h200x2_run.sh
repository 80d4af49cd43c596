#!/usr/bin/env bash
# Two-GPU device call (kind nvidia-h200-x2): the sampler's per-GPU cost with two GPUs,
# and a recording of both GPUs while GPU 0 runs a bf16 GEMM loop and GPU 1 a copy loop.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
python3 bench/sampler_cost.py --windows 10
load="import sys; sys.path.insert(0, 'bench'); import loops; loops.{}(24.0)"
CUDA_VISIBLE_DEVICES=0 python3 -c "${load/\{\}/gemm}" &
CUDA_VISIBLE_DEVICES=1 python3 -c "${load/\{\}/copy}" &
sleep 3
python3 -m kernelfleet record -o "${OUT:-/tmp}/h200x2-gemm-copy.jsonl.gz" --duration 15 --note "2x H200: GPU 0 bf16 GEMM loop, GPU 1 copy loop"
python3 -m kernelfleet watch --once
wait
