#!/usr/bin/env bash
# One placed model answering curl, as a user would run it on one GPU: a Llama of 8 layers (hidden 2048, config
# only, so seeded random bf16 weights, alike on every device) planned by `kernelfleet plan-serve` on two partitions
# of GPU 0 (a:64 and b:56), then served twice, on the whole GPU alone and through the plans, each asked the same
# greedy completion by `curl -N` with "stream": true. The two streams' token ids must be identical. (128 tokens a
# slot: one context bucket each, so both attend the same positions.) Run on an H100 on 2026-12-07: identical
# (docs/validation/serve-gpu.md, twelfth run).
#
#   bash bench/serve_curl.sh DIR          # on a GPU; writes DIR/curl_{single,placed}.txt (the streams as curl
#                                         # printed them), DIR/curl_*.err (the servers' start-up), DIR/plan_serve.txt
# Exit 0 only when both streams ended in [DONE] with the same tokens; the last line says what was compared.
set -u
out=${1:?usage: bash bench/serve_curl.sh DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
command -v curl > /dev/null || { echo "serve_curl: curl is not installed here" >&2; exit 2; }
echo "command: bash bench/serve_curl.sh $out"
python3 -c "
from transformers import LlamaConfig
LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=8, max_position_embeddings=512).save_pretrained('$work/llama')" || exit 1
model=hf:$work/llama
python3 -m kernelfleet plan-serve "$model" --profile a:64 --profile b:56 --slots 2 --context 128 \
    --out "$work/plans" > "$out/plan_serve.txt" 2>&1 || { tail -3 "$out/plan_serve.txt"; exit 1; }
tail -1 "$out/plan_serve.txt"
python3 -m kernelfleet serve "$model" --slots 2 --context 128 --listen 127.0.0.1:8101 2> "$out/curl_single.err" &
single=$!
python3 -m kernelfleet serve "$model" --plans "$work/plans" --profile a:64@0 --profile b:56@0 --context 128 \
    --listen 127.0.0.1:8102 2> "$out/curl_placed.err" &
placed=$!
trap 'kill -INT $single $placed 2> /dev/null; wait; rm -rf "$work"' EXIT
for server in "single $single 8101" "placed $placed 8102"; do  # each up, or its start-up's last line and out
    read -r name pid port <<< "$server"
    until curl -sf "127.0.0.1:$port/healthz" > /dev/null; do
        kill -0 "$pid" 2> /dev/null || { echo "the $name server stopped: $(tail -1 "$out/curl_$name.err")"; exit 1; }
        sleep 1
    done
done
body='{"prompt": [128, 3, 71, 2048, 9, 15000], "max_tokens": 32, "temperature": 0, "stream": true}'
for server in "single 8101" "placed 8102"; do
    read -r name port <<< "$server"
    echo "\$ curl -sN 127.0.0.1:$port/v1/completions -H 'content-type: application/json' -d '$body'" \
        > "$out/curl_$name.txt"
    curl -sN "127.0.0.1:$port/v1/completions" -H 'content-type: application/json' -d "$body" >> "$out/curl_$name.txt"
done
python3 - "$out/curl_single.txt" "$out/curl_placed.txt" <<'EOF'
import json
import sys


def streamed(path):
    """The token ids of a streamed completion as curl printed it, and whether it ended in [DONE]."""
    lines = [line[len("data: "):] for line in open(path) if line.startswith("data: ")]
    tokens = [t for line in lines if line.startswith("{") for t in json.loads(line)["choices"][0]["token_ids"]]
    return tokens, bool(lines) and lines[-1].strip() == "[DONE]"


(single, done_single), (placed, done_placed) = map(streamed, sys.argv[1:])
print(f"single device: {len(single)} tokens {single}")
print(f"placed:        {len(placed)} tokens {placed}")
same = done_single and done_placed and single == placed and len(single) == 32
print("streamed tokens identical" if same else "streamed tokens differ (or a stream did not end)")
sys.exit(0 if same else 1)
EOF
