#!/usr/bin/env bash
# Everything the see half measures on a GPU, in one device call (about 4 minutes; `make record-see`):
# NVML call costs, the sampler's CPU cost, the fixture recordings with their
# CUDA-event timelines, `watch --once --json` against timed MFU, and 2-ms clock reads.
# Usage on the GPU machine, from the repo root:  bash bench/h200_run.sh   (results in $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
res=$out/results
mkdir -p "$res"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$res/nvidia-smi.txt"
python3 -m bench.nvml_calls 2>&1 | tee "$res/nvml_calls.txt"
python3 -m bench.sampler_cost --windows 5 2>&1 | tee "$res/sampler_cost.txt"
python3 -m bench.record_traces --out "$res" 2>&1 | tee "$res/record.log"
python3 -m bench.clock_density --out "$res" 2>&1 | tee "$res/clock_density.txt"
# $OUT returns at most 8 files: one archive.
tar -C "$out" -czf "$out/results.tar.gz" results && rm -r "$res"
