#!/usr/bin/env bash
# Nsight Compute on every GEMM of the OFU sweep (issue 4): one launch per point, with the SM
# cycles that elapsed, the clock they imply, the tensor instructions and the executed tensor math
# ops per source type. Clocks are never locked (--clock-control none).
#   bash bench/ncu_sweep.sh        # on a GPU; writes $OUT/ncu-sweep.csv and $OUT/ncu-sweep-points.jsonl
#   PRECISIONS="tf32 fp8 fp64" NCU_TIMEOUT=120 bash bench/ncu_sweep.sh   # only those precisions' points
#   kernelfleet bench ofu-report tests/data/h200-sweep --ncu $OUT   # anywhere: the check (docs/validation/ofu.md)
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# ncu --query-metrics lists one base name a line, name first; the guard below reads names from it.
timeout 60 ncu --query-metrics --chip gh100 > /tmp/ncu-metrics.txt 2>&1 \
    || timeout 60 ncu --query-metrics > /tmp/ncu-metrics.txt 2>&1
grep -E '^sm__(ops_path_tensor|pipe_tensor|inst_executed_pipe_tensor)' /tmp/ncu-metrics.txt > "$out/ncu-query-tensor.txt"
list="sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second,sm__cycles_active.avg,gpu__time_duration.sum"
list="$list,sm__inst_executed_pipe_tensor.sum"
# Executed math ops per tensor path without the _sparsity_on/_off split, and every tensor pipe's
# active cycles. The 2026-11 run (this pattern without the fp8/fp64 totals, cut at 24 names) got
# every HGMMA/HMMA name and two pipe names but no QGMMA or DMMA ops path, which sorts before the
# pipe names, so gh100 lists none: fp8 and fp64 ops come from ncu's per-source totals
# (sm__ops_path_tensor_src_fp8*, _fp64; validation/ncu.py takes the plain total, else the _dst_ split).
# Only names this ncu lists are asked for: an unknown one fails the run. A name is taken whole
# (up to the first blank), so a longer listed name never yields a shorter unlisted one.
select='^sm__(ops_path_tensor_op_(hgmma|hmma|qgmma|dmma)_src_[a-z0-9_]+|ops_path_tensor_src_(fp8|fp64)[a-z0-9_]*|pipe_tensor[a-z0-9_]*cycles_active)([[:space:]]|$)'
for name in $(grep -oE "$select" /tmp/ncu-metrics.txt | sed -E 's/[[:space:]]+$//' | grep -v sparsity | sort -u); do
    list="$list,$name.sum"
done
echo "metrics: $list" | tee "$out/ncu-metrics.txt"
case "$list" in *ops_path_tensor_src_fp8*) ;; *) echo "note: this ncu lists no sm__ops_path_tensor_src_fp8*: fp8 ops stay uncounted";; esac
case "$list" in *ops_path_tensor_src_fp64*) ;; *) echo "note: this ncu lists no sm__ops_path_tensor_src_fp64*: fp64 ops stay uncounted";; esac
# each_point_once runs every sweep point; PRECISIONS keeps a subset of them (empty: all 60).
keep="import kernelfleet.bench.ofu_sweep as s; full = s.points; keep = set('${PRECISIONS:-}'.split())
s.points = lambda: [p for p in full() if not keep or p[3] in keep]"
# -k matches the function's base name: cuBLAS's CUTLASS 2.x kernels are "cutlass::Kernel2<...>", base "Kernel2".
timeout -k 10 "${NCU_TIMEOUT:-420}" ncu --clock-control none --nvtx --nvtx-include "sweep/" -k "regex:Kernel2|nvjet|gemm|cutlass" \
    --metrics "$list" --csv \
    python3 -c "$keep
from pathlib import Path; s.each_point_once(Path('$out/ncu-sweep-points.jsonl'))" \
    > "$out/ncu-sweep.csv" 2> "$out/ncu-sweep.err"
rc=$?
echo "ncu rc=$rc"; tail -3 "$out/ncu-sweep.err"; wc -l "$out/ncu-sweep.csv" "$out/ncu-sweep-points.jsonl"
exit $rc
