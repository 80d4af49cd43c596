#!/usr/bin/env bash
# The GPU runs the serve and place issues still wait for, each part one device call of under 10 minutes on one
# GPU (H200, or H100: the report names the card); several modes may share one call, in order, their
# timeouts counted from its start (`place` takes about 2 minutes). Results under $OUT:
#   bash bench/pending_run.sh serve         # `bench.serve_gpu --cases plans`: the 8B's plans per bucket made by
#                                           # profile and plan (the MILP held to 15 s a bucket), then served three
#                                           # ways. Resumable: the plans made so far come back in
#                                           # $OUT/serve-plans.tgz; put in .gpuwork/ (carried), the next call
#                                           # starts from them (a bucket whose plans are there is not made again).
#                                           # Profile holds the step four times (the capture and three replicas
#                                           # for its whole-step graphs), ~72 GB for the 8B at 8 slots: it fits
#                                           # an H100 (about 4 minutes for one batch a step; docs/validation/
#                                           # serve-gpu.md, seventh run). Plans are of the step as the image's
#                                           # transformers captured it: those made before the calls carried
#                                           # transformers 5.24 (2026-12-06) hold its repeated keys and values,
#                                           # and the server refuses them for its 5.24 step: make them again
#   bash bench/pending_run.sh serve-moe     # the same for the MoE (--plans-model moe); kept plans travel as
#                                           # .gpuwork/serve-plans-moe.tgz; *-moe
#   bash bench/pending_run.sh serve-64      # the 8B's plans at 64 slots, the one-device case's (bench.serve_gpu
#                                           # --plan-slots 64: profiled with the step once a profile, about 67 GB),
#                                           # 32 requests a rate; resumable as serve is, its plans back in
#                                           # $OUT/serve-plans-64.tgz (carry it as .gpuwork/serve-plans-64.tgz):
#                                           # making them (7 buckets) likely takes a call of its own
#   bash bench/pending_run.sh serve-two     # what two batches in flight would give the placed server: the 8B's
#                                           # bucket-4 step (of 8 slots) planned --in-flight 2, then bench disagg
#                                           # --slots 2 (two half batches in one graph, chained and free) beside
#                                           # each device alone; about 2 minutes. Run on an H100 on 2026-12-06
#                                           # (twice; tests/data/h100-serve-two): request distribution of the
#                                           # halves is the best, so the server does not build it (docs/serve.md)
#   bash bench/pending_run.sh moe-strategies  # the MoE under request distribution, the split and the pipeline
#                                           # (bench.serve_gpu --cases moe-strategies, 12 requests a rate; the
#                                           # 8B's were run on an H200 on 2026-12-01/02): about 2 minutes; run on
#                                           # an H100 on 2026-12-06 (serve-gpu.md, eighth run)
#   bash bench/pending_run.sh capped        # the memory-capped pair three ways (bench.serve_gpu --cases capped:
#                                           # replicas, pipeline and the split), 48 requests a rate; ~4 min; run
#                                           # on an H100 on 2026-12-06 (serve-gpu.md, ninth run)
#   bash bench/pending_run.sh capped-plans  # kernelfleet's plans on the capped pair (bench.serve_gpu --cases
#                                           # capped,capped-plans: 32 slots, 20 GB a device, one share of the
#                                           # weights) beside its other three ways; resumable as serve-64 is, the
#                                           # plans back in $OUT/serve-plans-capped.tgz (carry it as
#                                           # .gpuwork/serve-plans-capped.tgz). Made and served in one call on an
#                                           # H100 on 2026-12-06 with transformers 5.24 (docs/validation/
#                                           # serve-gpu.md, tenth run)
#   bash bench/pending_run.sh capped-plans-64  # the same plans at the pipeline's 64 slots (--capped-plan-slots
#                                           # 64: the cache, 17.2 GB, on a; the weights nearly all on b), served
#                                           # alone; resumable as capped-plans is (serve-plans-capped-64.tgz).
#                                           # Since 2026-12-06 both are made on the whole GPU each, as the pair's
#                                           # other strategies run (the tenth run's were on partitions). The
#                                           # eleventh run made buckets 1-32, then bucket 64 did not fit bucket 1's
#                                           # share; plans made before its two fixes (serve-gpu.md) are refused:
#                                           # start afresh (about 7 minutes to make, then a call to serve)
#   bash bench/pending_run.sh serve-contexts  # the server's context buckets against one whole-context graph
#                                           # (bench.serve_contexts: the 8B at batches 1, 8 and 64, 64 slots of
#                                           # 2048 tokens, every context bucket), then the server's own GPU tests
#                                           # (tests/gpu/test_serve_gpu.py); about 3 minutes. Run on an H100 on
#                                           # 2026-12-06 (serve-gpu.md, eleventh run); the tests, mended since,
#                                           # passed on an H100 on 2026-12-07 (twelfth run)
#   bash bench/pending_run.sh curl          # one placed model answering curl (bench/serve_curl.sh): an 8-layer Llama
#                                           # planned on a:64 and b:56, served alone and through the plans, each
#                                           # asked one streamed greedy completion by curl -N; about 3 minutes;
#                                           # identical on an H100 on 2026-12-07 (serve-gpu.md, twelfth run)
#   bash bench/pending_run.sh carried       # the plans carried to context buckets (2026-12-07): the server's decode
#                                           # step recorded at 2048 and 128 positions (bench.record_serve_contexts,
#                                           # into $OUT/contexts: commit as tests/data/<card>-serve-contexts), then
#                                           # the placed-server GPU test serving plans made at 2048 with
#                                           # --shortest-context 128 (test_serve_placed.py -k long_context); ~5 min;
#                                           # passed on an H100 on 2026-12-07 (tests/data/h100-serve-contexts)
#   bash bench/pending_run.sh serve-tests   # the placed-server GPU tests (about 9 minutes: a call of its own;
#                                           # all four passed on an H100 on 2026-12-06)
#   bash bench/pending_run.sh place         # the link on this card; the Qwen2-MoE decode edge plans (they faulted
#                                           # an H200; on an H100 all ran, twice); the two same-kernel rows that
#                                           # missed on the H200: hf-mamba-decode (its pipeline's tail of copies
#                                           # home) and hf-qwen2moe-prefill (request distribution's shared factor).
#                                           # Run on an H100 on 2026-12-06 (four calls), not yet again on an H200;
#                                           # docs/validation/place-h200-pairs.md
#   bash bench/pending_run.sh place-table   # the whole placement table (bench.place_pairs: every target on both
#                                           # pairs, 22 rows, about 40 s each), as far as the call's time
#                                           # goes; resumable: the rows come back in $OUT/place-table.tgz (carry
#                                           # it as .gpuwork/place-table.tgz) and the next call runs the rest
#                                           # (--resume). To see it: python -m bench.place_table DIR/place-table.
#                                           # Run on an H100 on 2026-12-06 in two calls (tests/data/h100-place-table)
#   bash bench/pending_run.sh place-different  # the different-kernel pair's 11 rows of it (--pairs different),
#                                           # resumable as place-table is (place-different.tgz): since 2026-12-06
#                                           # its profiles keep the pair's graphs launched together (not yet run)
#   bash bench/pending_run.sh place-x2      # issue 20's place rows, on a machine of two GPUs (nvidia-h200-x2):
#                                           # bench.place_pairs --pairs same-x2 different-x2 gpus (33 rows: the two
#                                           # pairs with b on GPU 1, and two whole GPUs), resumable as place-table
#   bash bench/pending_run.sh place-nccl-x2 # issue 20's process-per-GPU rows: Llama and Qwen2-MoE decode from
#                                           # transformers on different-x2 and gpus, each also under torchrun
#                                           # (bench.place_pairs --phases profile plan disagg nccl: bench
#                                           # disagg-nccl, b's rank capturing its own kernels), resumable as
#                                           # place-table is (place-nccl-x2.tgz)
#   bash bench/pending_run.sh capped-x2 strategies-x2  # issue 20's serve runs on two GPUs (bench.serve_gpu
#                                           # --second-gpu 1: each pair's second device on GPU 1, the plans on the
#                                           # whole of each): the capped pair four ways (plans at 64 slots,
#                                           # resumable as capped-plans is), then the strategies at full size
# Packages the image lacks travel as wheels in .whl (the device README says how); the caller
# installs them first. transformers 5.24 travels too: the image's older one (5.17) repeats every
# layer's keys and values in each decode step (half the 8B's step at batch 8 on an H100;
# tests/replay/test_serve_two_h100.py). PENDING_SECONDS: the seconds the modes share (default 580;
# less when the call runs something else first); PENDING_TESTS: serve-tests runs only the tests it
# matches (pytest -k); PENDING_REQUESTS: requests a Poisson rate in serve and serve-moe (default 8).
set -u
[ $# -gt 0 ] || set -- usage
for mode in "$@"; do
    case "$mode" in serve|serve-moe|serve-64|serve-two|moe-strategies|capped|capped-plans|capped-plans-64|serve-tests|\
        serve-contexts|curl|carried|place|place-table|place-different|place-x2|place-nccl-x2|capped-x2|strategies-x2) ;;
    *) echo "usage: bash bench/pending_run.sh MODE ... (MODE: serve, serve-moe, serve-64, serve-two, moe-strategies," \
            "capped, capped-plans, capped-plans-64, serve-contexts, curl, carried, serve-tests, place, place-table," \
            "place-different, place-x2, place-nccl-x2, capped-x2, strategies-x2)" >&2
       exit 2 ;; esac
done
OUT=${OUT:-/tmp/kf-out}
END=${PENDING_SECONDS:-580}
REQUESTS=${PENDING_REQUESTS:-8}  # a Poisson rate's requests in serve and serve-moe
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.total --format=csv > "$OUT/smi.txt"
serve_run() {  # serve_run DIR LOG REPORT FLAGS...: bench.serve_gpu --out DIR FLAGS, its log as $OUT/LOG.txt and
    # its report as $OUT/REPORT.json, the log's tables shown
    local dir=$1 log=$2 report=$3
    shift 3
    timeout $((END - SECONDS)) python3 -m bench.serve_gpu --out "$dir" "$@" > "$OUT/$log.txt" 2>&1
    cp "$dir/serve_gpu.json" "$OUT/$report.json" 2>/dev/null
    grep -v '^{' "$OUT/$log.txt" | tail -40
}
plans_run() {  # plans_run NAME OUT FLAGS...: serve_run with its plans in /tmp/NAME, made where an earlier call's
    # $OUT/NAME.tgz (carried as .gpuwork/NAME.tgz) lacks them; the plans (not the profiles' large programs) and the
    # run's servers' logs come back in $OUT/NAME.tgz, the log and report as $OUT/OUT.{txt,json}
    local name=$1 log=$2
    shift 2
    [ -f ".gpuwork/$name.tgz" ] && tar xzf ".gpuwork/$name.tgz" -C /tmp "$name"
    serve_run "/tmp/$name-run" "$log" "$log" --plans-dir "/tmp/$name" --plan-seconds 15 "$@"
    tar czf "$OUT/$name.tgz" -C /tmp --exclude='prof-*' "$name" "$name-run" 2>/dev/null
}
for mode in "$@"; do  # several in one call share its 10 minutes (the timeouts count from the call's start)
case "$mode" in
serve-tests)
    timeout $((END - 10 - SECONDS)) python3 -m pytest -m gpu tests/gpu/test_serve_placed.py -s -p no:cacheprovider \
        ${PENDING_TESTS:+-k "$PENDING_TESTS"} > "$OUT/serve_placed.txt" 2>&1
    tail -5 "$OUT/serve_placed.txt"
    ;;
curl)
    timeout $((END - SECONDS)) bash bench/serve_curl.sh "$OUT/curl" | tail -4
    ;;
carried)
    timeout 90 python3 -m bench.record_serve_contexts --out "$OUT/contexts" > "$OUT/record_contexts.txt" 2>&1
    tail -4 "$OUT/record_contexts.txt"
    timeout $((END - 10 - SECONDS)) python3 -m pytest -m gpu tests/gpu/test_serve_placed.py -k long_context -s \
        -p no:cacheprovider > "$OUT/serve_placed_carried.txt" 2>&1
    tail -5 "$OUT/serve_placed_carried.txt"
    ;;
serve-contexts)
    timeout $((END - SECONDS)) python3 -m bench.serve_contexts --out /tmp/contexts > "$OUT/serve_contexts.txt" 2>&1
    grep -v '^{' "$OUT/serve_contexts.txt" | tail -30
    cp /tmp/contexts/serve_contexts.json "$OUT/" 2>/dev/null
    timeout $((END - 10 - SECONDS)) python3 -m pytest -m gpu tests/gpu/test_serve_gpu.py -p no:cacheprovider \
        > "$OUT/serve_gpu_tests.txt" 2>&1
    tail -5 "$OUT/serve_gpu_tests.txt"
    ;;
serve) plans_run serve-plans serve_plans --cases plans --requests "$REQUESTS" ;;
serve-moe) plans_run serve-plans-moe serve_plans_moe --cases plans --plans-model moe --requests "$REQUESTS" ;;
serve-64) plans_run serve-plans-64 serve_plans_64 --cases plans --plan-slots 64 --requests 32 ;;
capped-plans)  # beside the pair's other three ways
    plans_run serve-plans-capped serve_capped_plans --cases capped,capped-plans --requests 48 ;;
capped-plans-64) plans_run serve-plans-capped-64 serve_capped_64_plans --cases capped-plans --capped-plan-slots 64 \
    --requests 48 ;;
capped-x2)  # issue 20, on two GPUs: the capped pair four ways, each pair's second device on GPU 1
    plans_run serve-plans-capped-x2 serve_capped_x2 --cases capped,capped-plans --capped-plan-slots 64 \
        --second-gpu 1 --requests 48 ;;
strategies-x2)  # issue 20: request distribution, the split and the pipeline at full size, on two GPUs
    serve_run /tmp/serve-strategies-x2 serve_strategies_x2 serve_strategies_x2 --cases replicas,split,pipeline \
        --second-gpu 1 --requests 12 ;;
serve-two)
    mkdir -p /tmp/two/model
    python3 -c "from bench.serve_gpu import LLAMA8B, config_json; print(config_json(LLAMA8B))" > /tmp/two/model/config.json
    step=hf:/tmp/two/model,serve-decode,batch=4,slots=8,context=2048
    { timeout 150 python3 -m kernelfleet profile $step --profile a:64 --profile b:56 --out /tmp/two/prof &&
      timeout 60 python3 -m kernelfleet plan /tmp/two/prof/program.json /tmp/two/prof/costs.json --device a \
          --device b --policy all --state-home --in-flight 2 --time-limit 15 --out /tmp/two/plans &&
      timeout $((END - SECONDS)) python3 -m kernelfleet bench disagg $step --plans /tmp/two/plans --device a:64@0 \
          --device b:56@0 --slots 2 --costs /tmp/two/prof/costs.json --out /tmp/two/runs; } > "$OUT/serve_two.txt" 2>&1
    cp /tmp/two/runs/disagg.json "$OUT/serve_two_disagg.json" 2>/dev/null
    tar czf "$OUT/serve-two.tgz" -C /tmp --exclude='*.gz' two 2>/dev/null
    tail -40 "$OUT/serve_two.txt"
    ;;
capped) serve_run /tmp/serve-capped serve_capped serve_gpu_capped --cases capped --requests 48 ;;
moe-strategies) serve_run /tmp/serve-moe-strategies serve_moe_strategies serve_gpu_moe_strategies \
    --cases moe-strategies --requests 12 ;;
place)
    timeout 45 python3 -m bench.link_cost --out /tmp/place/link --profile a:64 --profile b:32 > "$OUT/link.txt" 2>&1
    link=/tmp/place/link/links.json
    [ -f $link ] || link=tests/data/h200-link/links.json
    timeout 150 python3 -m bench.edge_cost --out /tmp/place/edges --targets hf-qwen2moe-decode --repeats 10 \
        --link $link > "$OUT/edge_qwen2moe.txt" 2>&1
    tail -15 "$OUT/edge_qwen2moe.txt"
    timeout $((END + 10 - SECONDS)) python3 -m bench.place_pairs --out /tmp/place/pairs --targets hf-mamba-decode \
        hf-qwen2moe-prefill --pairs same --budget-s $((END - 100 - SECONDS)) > "$OUT/place_pairs.txt" 2>&1
    tail -15 "$OUT/place_pairs.txt"
    tar czf "$OUT/place.tgz" -C /tmp place
    ;;
place-table|place-different|place-x2|place-nccl-x2)
    # the whole table, the different-kernel pair's 11 rows alone, or the two-GPU rows (place-x2, place-nccl-x2)
    name=$mode pairs=()
    [ "$mode" = place-different ] && pairs=(--pairs different)
    [ "$mode" = place-x2 ] && pairs=(--pairs same-x2 different-x2 gpus)
    [ "$mode" = place-nccl-x2 ] && pairs=(--pairs different-x2 gpus --targets hf-llama-decode hf-qwen2moe-decode \
        --phases profile plan disagg nccl)
    mkdir -p "/tmp/$name"
    [ -f ".gpuwork/$name.tgz" ] && tar xzf ".gpuwork/$name.tgz" -C /tmp "$name"
    cat "$OUT/smi.txt" >> "/tmp/$name/smi.txt"  # one nvidia-smi line a call
    timeout $((END + 10 - SECONDS)) python3 -m bench.place_pairs --out "/tmp/$name" --resume "${pairs[@]}" \
        --budget-s $((END - 100 - SECONDS)) > "$OUT/${name/-/_}.txt" 2>&1
    tail -4 "$OUT/${name/-/_}.txt"
    tar czf "$OUT/$name.tgz" -C /tmp "$name"
    ;;
esac
done
