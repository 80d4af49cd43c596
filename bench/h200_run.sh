#!/usr/bin/env bash
# Everything the see half measures on a GPU, in one device call (about 4 minutes):
# NVML call costs, the sampler's CPU cost, the fixture recordings with their
# CUDA-event timelines, `watch --once --json` against timed MFU, and 2-ms clock reads.
# Usage on the GPU machine, from the repo root:  bash bench/h200_run.sh   (results in $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
res=$out/results
mkdir -p "$res"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$res/nvidia-smi.txt"
python3 bench/gpm_cycles_probe.py 2>&1 | tee "$res/gpm_cycles.txt"
python3 bench/nvml_calls.py 2>&1 | tee "$res/nvml_calls.txt"
python3 bench/sampler_cost.py --windows 5 2>&1 | tee "$res/sampler_cost.txt"
python3 bench/record_traces.py --out "$res" 2>&1 | tee "$res/record.log"
python3 bench/clock_density.py --out "$res" 2>&1 | tee "$res/clock_density.txt"
# $OUT returns at most 8 files: one archive.
tar -C "$out" -czf "$out/results.tar.gz" results && rm -r "$res"
