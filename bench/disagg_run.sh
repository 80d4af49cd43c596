#!/usr/bin/env bash
# The disaggregation benchmark for the 8B Llama steps, in two halves:
#   bash bench/disagg_run.sh plans DIR   # CPU (needs HiGHS): programs, measured costs and every plan, into DIR
#   bash bench/disagg_run.sh run DIR     # two GPUs: bench disagg on both steps with list-scheduled slots and
#                                        # predicted times
#   bash bench/disagg_run.sh nccl DIR    # two GPUs: the same strategies with a process per GPU and NCCL between
#                                        # them (torchrun; bench disagg-nccl)
# Results of `run` under $OUT (default /tmp/kf-disagg). The plans travel to the GPU machine with DIR.
set -u
what=${1:?plans or run}
DIR=${2:?a folder}
export PYTHONPATH=$PWD
PY=${PYTHON:-python3}  # PYTHON=.venv/bin/python here, where the venv holds the place extra
STEPS=${STEPS:-llama8b-decode llama8b-prefill}
if [ "$what" = plans ]; then
    set -e
    $PY -m bench.plan_measured --out "$DIR/measured" --time-limit 20 --steps "${STEPS// /,}"
    for step in $STEPS; do
        $PY -m kernelfleet plan "$DIR/measured/$step.program.json" "$DIR/measured/$step.costs.json" \
            --policy all --time-limit 20 --in-flight 3 --out "$DIR/$step"
        cp "$DIR/measured/$step.costs.json" "$DIR/$step.costs.json"
    done
    exit 0
fi
OUT=${OUT:-/tmp/kf-disagg}
mkdir -p "$OUT"
if [ "$what" = nccl ]; then
    for step in $STEPS; do
        timeout ${STEP_SECONDS:-240} torchrun --nproc-per-node 2 -m kernelfleet bench disagg-nccl "$step" \
            --plans "$DIR/$step" --costs "$DIR/$step.costs.json" --slots ${SLOTS:-3} --out "$OUT/$step" > "$OUT/$step.nccl.txt" 2>&1
        echo "$step exit $?" >> "$OUT/$step.nccl.txt"
        tail -n 30 "$OUT/$step.nccl.txt"
    done
    exit 0
fi
for step in $STEPS; do
    timeout ${STEP_SECONDS:-240} $PY -m kernelfleet bench disagg "$step" --plans "$DIR/$step" --costs "$DIR/$step.costs.json" \
        --slots ${SLOTS:-3} --out "$OUT/$step" > "$OUT/$step.txt" 2>&1
    echo "$step exit $?" >> "$OUT/$step.txt"
done
tail -n 40 "$OUT"/*.txt
