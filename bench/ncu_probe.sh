#!/usr/bin/env bash
# Exploratory (issue 4): which Nsight Compute tensor metrics this H200 exposes, and their
# values for three GEMMs (aligned, unaligned, short K), to separate padded tile work from
# busy-but-idle pipe cycles. Clocks are never locked (--clock-control none).
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out/ncu"
export PYTHONPATH=$PWD
ncu --query-metrics --chip gh100 > "$out/ncu/metrics.txt" 2>&1 || ncu --query-metrics > "$out/ncu/metrics.txt" 2>&1
grep -iE "tensor|gmma" "$out/ncu/metrics.txt" | head -60
# Names this H200's ncu lists (2026-11-29): executed tensor math ops per source type, pipe-active cycles.
list="sm__cycles_elapsed.avg,sm__cycles_active.avg,sm__pipe_tensor_cycles_active.sum"
list="$list,sm__pipe_tensor_op_hmma_cycles_active.sum,sm__inst_executed_pipe_tensor.sum"
list="$list,sm__ops_path_tensor_src_bf16_dst_fp32.sum,sm__ops_path_tensor_src_fp16.sum"
list="$list,sm__ops_path_tensor_src_fp8.sum,sm__ops_path_tensor_src_fp64.sum"
list="$list,sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum"
echo "metrics: $list"
cat > /tmp/gemms.py <<'PY'
import torch
for m, n, k in ((8192, 8192, 8192), (8200, 8200, 8200), (8192, 8192, 1024)):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        torch.mm(a, b)
torch.cuda.synchronize()
PY
timeout 300 ncu --clock-control none --metrics "$list" -k regex:nvjet --csv python3 /tmp/gemms.py > "$out/ncu/gemms.csv" 2> "$out/ncu/gemms.err"
echo "ncu rc=$?"; tail -5 "$out/ncu/gemms.err"; wc -l "$out/ncu/gemms.csv"
tar -C "$out" -czf "$out/ncu.tar.gz" ncu && rm -r "$out/ncu"
