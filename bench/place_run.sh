#!/usr/bin/env bash
# The place half on one H200, in one call: capture the reference workloads, check every access
# claim (node-by-node replay, memory-diff, dynamic range probe), sweep green-context profiles and
# time kernels on the pair closest to L40S + A100, and run the CLI commands (analyze, calibrate,
# profile) once. Results under $OUT (default /tmp/kf-out):
#   bash bench/place_run.sh   (or `make record-capture`)
set -u
OUT=${OUT:-/tmp/kf-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
python3 -c "import cuda.bindings, torch, triton; print('cuda.bindings', cuda.bindings.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" > "$OUT/versions.txt" 2>&1
nvidia-smi >> "$OUT/versions.txt" 2>&1
timeout ${CAPTURE_SECONDS:-420} python3 -m bench.capture_run --out "$OUT/capture" ${CAPTURE_ARGS:-} > "$OUT/capture_run.txt" 2>&1
echo "capture_run exit $?" >> "$OUT/capture_run.txt"
{
    python3 -m kernelfleet analyze kernelfleet.workloads.steps:llama_decode --out "$OUT/cli/analyze"; echo "analyze exit $?"
    python3 -m kernelfleet calibrate --profile compute:56+64 --profile bandwidth:32 --out "$OUT/cli/calibrate.json"; echo "calibrate exit $?"
    python3 -m kernelfleet profile kernelfleet.workloads.steps:llama8b_prefill --profile compute:56+64 \
        --profile bandwidth:32 --out "$OUT/cli/profile"; echo "profile exit $?"
} > "$OUT/cli.txt" 2>&1
tar czf "$OUT/capture.tgz" -C "$OUT" capture cli && rm -rf "$OUT/capture" "$OUT/cli"
tail -c 6000 "$OUT/capture_run.txt"
