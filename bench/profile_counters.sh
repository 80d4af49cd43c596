#!/usr/bin/env bash
# Hardware counters per device profile (issue 6): Nsight Compute on one launch of every distinct
# kernel (kernelfleet/profile/groups.py) of two steps, on the whole H200 and on the emulated pair's
# work partitions (56 and 32 SMs), each inside the NVTX ranges counters/<profile>/<group>
# (kernelfleet/profile/ncu_run.py). Clocks are never locked (--clock-control none). One H200, about
# 3 minutes: every ncu run is under `timeout`, and stops starting groups well before it.
#   bash bench/profile_counters.sh    # on a GPU, from the repo root: $OUT/counters/<step>.ncu.csv,
#                                     # <step>.groups.json, <step>.ncu.err, profile_counters.log
#   kernelfleet census tests/data/h200-capture/llama8b-decode.profile.json \
#       --counters $OUT/counters/llama8b-decode.ncu.csv        # anywhere: the census by class
# The 2026-11-30 run is committed as tests/data/h200-counters (CSVs gzipped: `gzip -9n`; census
# reads .ncu.csv.gz as well). It profiled 31 of 48 and 32 of 46 kernel groups before START_SECONDS
# (the heaviest, all but 0.5 % of the whole GPU's time); raise it and STEP_SECONDS for all.
set -u
out=${OUT:-/tmp/out}/counters
mkdir -p "$out"
export PYTHONPATH=$PWD
steps=${STEPS:-llama8b-decode llama8b-prefill}
step_seconds=${STEP_SECONDS:-85}      # hard limit of one ncu run
start_seconds=${START_SECONDS:-62}    # no group starts after this; ncu then writes its CSV
profiles=${PROFILES:-whole,compute:56,bandwidth:32}
log="$out/profile_counters.log"
{
    echo "command: bash bench/profile_counters.sh (steps: $steps; profiles: $profiles)"
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
    ncu --version | tail -1
} 2>&1 | tee "$log"

# Only metrics this ncu lists for the GPU are asked for: an unknown name fails the whole run.
# The list mirrors kernelfleet/profile/counters.py (METRICS).
timeout 20 ncu --query-metrics --chip gh100 > "$out/ncu-query-metrics.txt" 2>&1 \
    || timeout 20 ncu --query-metrics > "$out/ncu-query-metrics.txt" 2>&1
wanted="gpu__time_duration.sum sm__throughput.avg.pct_of_peak_sustained_elapsed
gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed dram__throughput.avg.pct_of_peak_sustained_elapsed
dram__bytes_read.sum dram__bytes_write.sum lts__t_bytes.sum sm__pipe_tensor_cycles_active.sum sm__cycles_active.avg
sm__cycles_elapsed.avg sm__warps_active.avg.pct_of_peak_sustained_active launch__grid_size"
list=""
if grep -qE '^sm__throughput([[:space:]]|$)' "$out/ncu-query-metrics.txt"; then
    for m in $wanted; do
        if grep -qE "^${m%%.*}([[:space:]]|$)" "$out/ncu-query-metrics.txt"; then
            list="$list,$m"
        else
            echo "not listed by this ncu, left out: $m" | tee -a "$log"
        fi
    done
else  # the query failed or lists differently: ask for everything and let ncu say
    echo "ncu --query-metrics gave no usable list (see ncu-query-metrics.txt); asking for every metric" | tee -a "$log"
    list=$(echo $wanted | tr ' ' ',')
fi
list=${list#,}
echo "metrics: $list" | tee -a "$log"

for step in $steps; do
    t0=$(date +%s)
    echo "== $step" | tee -a "$log"
    # stdout is the CSV, so the driver logs to stderr. Kernel names come demangled (ncu's default);
    # the parser checks them against the capture's mangled ones (profile/counters.py, same_kernel).
    timeout -k 10 "$step_seconds" ncu --clock-control none --nvtx --nvtx-include "counters/" \
        --metrics "$list" --csv \
        python3 -m kernelfleet.profile.ncu_run --step "$step" --out "$out" --profiles "$profiles" \
            --seconds "$start_seconds" --order-by "tests/data/h200-capture/$step.profile.json" \
        > "$out/$step.ncu.csv" 2> "$out/$step.ncu.err"
    echo "$step: ncu exit $? after $(( $(date +%s) - t0 )) s; $(grep -c '^"' "$out/$step.ncu.csv") CSV lines" | tee -a "$log"
    grep -E '^ncu_run|==ERROR==|==WARNING==|Error|error' "$out/$step.ncu.err" | head -20 | tee -a "$log"
    # which profiles ncu returned rows for, from the NVTX column
    for p in $(echo "$profiles" | tr ',' ' '); do
        name=${p%%:*}
        echo "  $name: $(grep -c ":${name}:" "$out/$step.ncu.csv") metric rows" | tee -a "$log"
    done
    timeout 60 python3 -m kernelfleet census "tests/data/h200-capture/$step.profile.json" \
        --counters "$out/$step.ncu.csv" 2>&1 | tee -a "$log"
done
