#!/usr/bin/env bash
# Nsight Compute on every GEMM of the OFU sweep (issue 4): one launch per point, with the SM
# cycles that elapsed, the clock they imply, the tensor instructions and the executed tensor math
# ops per source type. Clocks are never locked (--clock-control none).
#   bash bench/ncu_sweep.sh        # on a GPU; writes $OUT/ncu-sweep.csv and $OUT/ncu-sweep-points.jsonl
#   kernelfleet bench ofu-report tests/data/h200-sweep --ncu $OUT   # anywhere: the check (docs/validation/ofu.md)
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD
ncu --query-metrics --chip gh100 > /tmp/ncu-metrics.txt 2>&1 || ncu --query-metrics > /tmp/ncu-metrics.txt 2>&1
list="sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second,sm__cycles_active.avg,gpu__time_duration.sum"
list="$list,sm__inst_executed_pipe_tensor.sum"
# Executed math ops per tensor path without the _sparsity_on/_off split, and every tensor pipe's
# active cycles. The 2026-11 run (this pattern without the fp8/fp64 totals, cut at 24 names) got
# every HGMMA/HMMA name and two pipe names but no QGMMA or DMMA ops path, which sorts before the
# pipe names, so gh100 lists none: fp8 and fp64 ops come from ncu's per-source totals
# (sm__ops_path_tensor_src_fp8*, _fp64). Only names this ncu lists are asked for: an unknown one fails the run.
select='^sm__(ops_path_tensor_op_(hgmma|hmma|qgmma|dmma)_src_[a-z0-9_]+|ops_path_tensor_src_(fp8|fp64)[a-z0-9_]*|pipe_tensor[a-z0-9_]*cycles_active)'
for name in $(grep -oE "$select" /tmp/ncu-metrics.txt | grep -v sparsity | sort -u); do
    list="$list,$name.sum"
done
echo "metrics: $list" | tee "$out/ncu-metrics.txt"
# -k matches the function's base name: cuBLAS's CUTLASS 2.x kernels are "cutlass::Kernel2<...>", base "Kernel2".
timeout 420 ncu --clock-control none --nvtx --nvtx-include "sweep/" -k "regex:Kernel2|nvjet|gemm|cutlass" \
    --metrics "$list" --csv \
    python3 -c "from pathlib import Path; from kernelfleet.bench.ofu_sweep import each_point_once; each_point_once(Path('$out/ncu-sweep-points.jsonl'))" \
    > "$out/ncu-sweep.csv" 2> "$out/ncu-sweep.err"
echo "ncu rc=$?"; tail -3 "$out/ncu-sweep.err"; wc -l "$out/ncu-sweep.csv" "$out/ncu-sweep-points.jsonl"
