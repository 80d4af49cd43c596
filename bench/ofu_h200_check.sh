#!/usr/bin/env bash
# Issue 4 on one H200, in one device call (about 5.5 minutes; every stage capped by `timeout`, 8 at most):
#   1. hook   the opt-in hook's profiled step on a real bf16 training job, against the real agent
#             (bench/hook_check.py): honest and doubled MFU reports, flagged or not    ~65 s (cap 90)
#   2. clock  the 0.908 question (bench/ofu_clock_check.py): steady GEMM loops beside a cycle probe,
#             GPM and 1-ms NVML reads                                                   ~50 s (cap 80)
#             and one launch per point under ncu beside the same NVML reads             ~50 s (cap 95)
#             and bf16 8192^3 with memory work between the GEMMs (duty 0.86 ... 0.20)    ~25 s (cap 60)
#   3. ncu    bench/ncu_sweep.sh on the tf32 (CUTLASS 2.x Kernel2 included), fp8 and fp64 points,
#             with the fp8/fp64 per-source ops totals                                   ~90 s (cap 110)
#   4. report the verdicts from the files, as anywhere (kernelfleet bench ofu-report)   ~10 s (cap 2 x 20)
# A stage that fails is logged [FAILED] and the next runs. Everything lands in ONE archive,
# $OUT/ofu-h200.tar.gz (hook/, clock/, clock-duty/, ncu/, env, stages and reports), since a device call returns 8 files.
# Usage on the GPU machine, from the repo root:  bash bench/ofu_h200_check.sh
# Anywhere, after unpacking hook/ into tests/data/h200-hook, clock/ into tests/data/h200-clock and ncu/'s
# ncu-sweep.csv[.gz] and points as tests/data/h200-sweep/ncu-rerun.csv.gz and ncu-rerun-points.jsonl:
#   kernelfleet bench ofu-report tests/data/h200-sweep --ncu tests/data/h200-sweep --clock tests/data/h200-clock
#   python3 -m bench.hook_check summary --out tests/data/h200-hook
set -u -o pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1  # keeps carried wheels (/tmp/site)
out=${OUT:-/tmp/out}
mkdir -p "$out/hook" "$out/clock" "$out/clock-duty" "$out/ncu"
stages=$out/stages.txt
: > "$stages"

stage() {  # stage NAME LOG COMMAND...: run it, log [ok] or [FAILED] with its time
    local name=$1 log=$2 began=$SECONDS rc
    shift 2
    "$@" 2>&1 | tee "$log"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "[ok] $name ($((SECONDS - began)) s)" | tee -a "$stages"
    else
        echo "[FAILED] $name rc=$rc ($((SECONDS - began)) s; log ${log#"$out"/})" | tee -a "$stages"
    fi
}

{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    python3 - <<'EOF'
import importlib.util
missing = [m for m in ("fastapi", "uvicorn", "pydantic") if importlib.util.find_spec(m) is None]
print("agent packages missing:", missing or "none", "(the hook check then uses its stdlib endpoint)" if missing else "")
EOF
    which ncu && ncu --version | tail -1
} 2>&1 | tee "$out/env.txt"

stage hook "$out/hook/log.txt" \
    timeout -k 10 90 env KERNELFLEET_JOB=hook-check python3 -m bench.hook_check run --out "$out/hook" --phase-seconds 22
stage clock-loop "$out/clock/loop.log" \
    timeout -k 10 80 python3 -m bench.ofu_clock_check loop --out "$out/clock" --seconds 2.5
stage clock-ncu "$out/clock/ncu.log" \
    timeout -k 10 95 python3 -m bench.ofu_clock_check ncu --out "$out/clock" --timeout 85
stage clock-duty "$out/clock-duty/duty.log" \
    timeout -k 10 60 python3 -m bench.ofu_clock_check duty --out "$out/clock-duty"
if [ -z "${SKIP_NCU_SWEEP:-}" ]; then  # SKIP_NCU_SWEEP=1: leave stage 3 out (it is the longest)
    stage ncu-sweep "$out/ncu/log.txt" \
        env OUT="$out/ncu" PRECISIONS="tf32 fp8 fp64" NCU_TIMEOUT=90 timeout -k 10 110 bash bench/ncu_sweep.sh
fi
stage report-clock "$out/report-clock.txt" \
    timeout -k 5 20 python3 -m kernelfleet bench ofu-report tests/data/h200-sweep --clock "$out/clock"
stage report-ncu "$out/report-ncu.txt" \
    timeout -k 5 20 python3 -m kernelfleet bench ofu-report tests/data/h200-sweep --ncu "$out/ncu"
stage report-duty "$out/report-duty.txt" \
    timeout -k 5 20 python3 -m kernelfleet bench ofu-report tests/data/h200-sweep --clock "$out/clock-duty"

cat "$stages"
tar -C "$out" -czf "$out/ofu-h200.tar.gz" hook clock clock-duty ncu env.txt stages.txt report-*.txt \
    && rm -r "$out/hook" "$out/clock" "$out/clock-duty" "$out/ncu" "$out/env.txt" "$out/stages.txt" "$out"/report-*.txt
ls -la "$out"
