#!/usr/bin/env bash
# Runs on the GPU machine: the CUDA serving path under hostile load. The server (dummy Llama-3-8B
# weights, int8 KV, fp8 weights, overlapped steps, decode graphs) gets a KV pool too small for its
# load, so sequences are preempted, while the load generator cancels 30% of the streams mid-flight
# (client cancel, then the Abort RPC) and sends 10% invalid requests. Then it checks that
#   - every request ended with exactly the status its kind expects (loadgen --fail-on-errors);
#   - the engine is back at its baseline: no running or waiting request, no KV block in use;
#   - the server still serves a clean load, and SIGTERM stops it with exit code 0.
# Exit code 0 when every check passes. Pack first, as for scripts/gpu_e2e.sh:
#   ../shared/gpu/pack.sh .devpack build/cuda/server/llm-server
#   cp -r build/cuda/python .devpack/ && cp build/cuda/models/tiny-llama/tokenizer.json .devpack/
# CHAOS_MODEL (default llama3-8b, a configs/models/ directory, served with dummy weights),
# CHAOS_KV (int8), CHAOS_DEVICE (the device flags, default "--device cuda --dummy-weights true
# --weight-dtype fp8"), CHAOS_EXTRA (more server flags; later flags win), CHAOS_REQUESTS (600 per
# chaos phase), CHAOS_IN / CHAOS_OUT (mean prompt / output tokens, 700 / 300),
# CHAOS_CLEAN_REQUESTS (128), CHAOS_REQUEST_TIMEOUT_S / CHAOS_LOAD_TIMEOUT_S (120 / 300: limits
# per request and per loadgen run that only catch a hang; a slow machine raises them). A dry run on the CPU (ctest chaos_cpu_dry_run runs a smaller one):
#   CHAOS_MODEL_DIR=build/cpu/models/tiny-llama CHAOS_KV=auto CHAOS_DEVICE="--device cpu"
#   CHAOS_EXTRA="--num-kv-blocks 256 --block-size 16 --max-num-seqs 16" CHAOS_REQUESTS=100
#   scripts/gpu_chaos.sh
set -uo pipefail
source "$(dirname "$0")/server_launch.sh"
OUT="${OUT:-$(pwd)/gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(pwd)/.devpack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
MODEL="${CHAOS_MODEL:-llama3-8b}"
model="${CHAOS_MODEL_DIR:-}"
if [ -z "$model" ]; then
  model=/tmp/$MODEL-chaos
  mkdir -p $model && cp configs/models/$MODEL/config.json $model/ && cp .devpack/tokenizer.json $model/
fi
SERVER="${CHAOS_SERVER:-.devpack/bin/llm-server}"
PROTO="${CHAOS_PROTO:-.devpack/python}"
PY="${CHAOS_PYTHON:-python3}"
fail=0
check() {  # check NAME CONDITION-EXIT-CODE DETAIL
  if [ "$2" = 0 ]; then echo "PASS  $1  $3"; else echo "FAIL  $1  $3"; fail=1; fi
}
log="$OUT/chaos_server.log"
# 640 blocks of 64 tokens hold 40,960 tokens; 128 streams of up to ~1,400 need more than that.
# Explicit options that cannot apply to the device are refused, so the CPU dry run replaces the
# device flags instead of overriding them.
# shellcheck disable=SC2086
if ! start_server "$log" "$SERVER" --model-dir $model ${CHAOS_DEVICE:---device cuda --dummy-weights true --weight-dtype fp8} \
    --kv-cache-dtype "${CHAOS_KV:-int8}" --max-num-seqs 128 \
    --max-batched-tokens 8192 --max-tokens-limit 4096 --num-kv-blocks 640 --block-size 64 \
    --listen-address 127.0.0.1:0 --metrics-address 127.0.0.1:0 --http-address 127.0.0.1:0 --shutdown-grace-s 5 \
    ${CHAOS_EXTRA:-}; then
  echo "FAIL  server start"
  exit 1
fi
metric() {  # metric NAME: its value on /metrics
  $PY -c "
import sys, urllib.request
for l in urllib.request.urlopen('http://127.0.0.1:$mport/metrics').read().decode().splitlines():
    if l.startswith('$1 '):
        print(l.split()[1])
"
}
load() {  # load NAME ARGS...: one loadgen run, its report in $OUT/NAME.txt
  local name=$1; shift
  timeout "${CHAOS_LOAD_TIMEOUT_S:-300}" $PY tools/loadgen.py --target 127.0.0.1:$port \
    --proto-python "$PROTO" --no-progress --fail-on-errors \
    --request-timeout "${CHAOS_REQUEST_TIMEOUT_S:-120}" --output-json "$OUT/$name.json" "$@" \
    > "$OUT/$name.txt" 2>&1
  local rc=$?
  check "$name" $rc "$(grep -E 'Status codes|Unexpected errors|Deliberate aborts' "$OUT/$name.txt" | tr -s ' ' | paste -sd ';')"
}
load chaos_cancel --num-requests "${CHAOS_REQUESTS:-600}" --concurrency 128 --input-len "${CHAOS_IN:-700}" --output-len "${CHAOS_OUT:-300}" \
  --range-ratio 0.9 --temperature 0.8 --seed 1 --abort-fraction 0.3 --abort-mode cancel \
  --invalid-fraction 0.1
load chaos_abort_rpc --num-requests "${CHAOS_REQUESTS:-600}" --concurrency 128 --input-len "${CHAOS_IN:-700}" --output-len "${CHAOS_OUT:-300}" \
  --range-ratio 0.9 --temperature 0 --seed 2 --abort-fraction 0.3 --abort-mode rpc \
  --invalid-fraction 0.1
# The idle engine refreshes its gauges every 100 ms: poll for the baseline (the limit only
# guards against a hang, so a slow machine never fails it).
for _ in $(seq 1 300); do
  running=$(metric llm_num_requests_running); waiting=$(metric llm_num_requests_waiting)
  usage=$(metric llm_kv_cache_usage_perc)
  $PY -c "import sys; sys.exit(0 if float('$running') == 0 and float('$waiting') == 0 and float('$usage') == 0 else 1)" && break
  sleep 0.2
done
pre=$(metric llm_num_preemptions_total)
check "baseline after the chaos" "$($PY -c "print(0 if float('$running') == 0 and float('$waiting') == 0 and float('$usage') == 0 else 1)")" \
  "running=$running waiting=$waiting kv_usage=$usage (preemptions so far: $pre)"
check "the pool was oversubscribed" "$($PY -c "print(0 if float('$pre') > 0 else 1)")" \
  "preemptions=$pre"
load clean_after --num-requests "${CHAOS_CLEAN_REQUESTS:-128}" --concurrency 64 --input-len 500 --output-len 100 \
  --temperature 0 --seed 3
kill -TERM $pid
code=timeout
for _ in $(seq 1 120); do  # shutdown grace 5 s; 120 s only guards against a hang
  if ! kill -0 $pid 2>/dev/null; then wait $pid; code=$?; break; fi
  sleep 1
done
[ "$code" = timeout ] && kill -KILL $pid
check "SIGTERM exit" "$([ "$code" = 0 ] && echo 0 || echo 1)" "exit code $code"
grep -iE "error|fatal|illegal" "$log" | grep -v "INVALID_ARGUMENT\|invalid" | head -5
exit $fail
