#!/usr/bin/env bash
# Runs on the GPU machine: the server on dummy Llama-3-8B (or E2E_MODEL) weights driven by the load generator,
# once per KV cache type. Results under $OUT. Pack first (see docs/BENCHMARKS.md):
#   ../shared/gpu/pack.sh .devpack build/cuda/server/llm-server ...; cp -r build/cpu/python .devpack/
set -uo pipefail
source "$(dirname "$0")/server_launch.sh"
OUT="${OUT:-$(pwd)/gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(pwd)/.devpack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NUM="${E2E_REQUESTS:-512}"; CONC="${E2E_CONCURRENCY:-256}"; IN="${E2E_IN:-1000}"; OUTLEN="${E2E_OUT:-1000}"
# E2E_BACKEND: grpc (default) | openai-completions | openai-chat, the API loadgen drives.
# E2E_EXTRA: more server flags (e.g. "--cuda-graph-max-batch 0" for eager decode steps).
# E2E_MODEL=deepseek-v2-lite serves the V2-Lite-shaped dummy config (MLA latent cache: auto = bf16,
# or fp8_e4m3) instead of Llama-3-8B.
E2E_MODEL="${E2E_MODEL:-llama3-8b}"
default_kv="auto fp8_e4m3_dynamic"
[ "$E2E_MODEL" = deepseek-v2-lite ] && default_kv="auto fp8_e4m3"
model=/tmp/$E2E_MODEL-dummy
# E2E_TOKENIZER: a tokenizer.json with at most the model's vocabulary (default .devpack's).
mkdir -p $model && cp configs/models/$E2E_MODEL/config.json $model/ &&
  cp "${E2E_TOKENIZER:-.devpack/tokenizer.json}" $model/tokenizer.json
for kv in ${E2E_KV:-$default_kv}; do
  log="$OUT/server_$kv.log"
  if ! start_server "$log" .devpack/bin/llm-server --model-dir $model --device cuda \
      --dummy-weights true --kv-cache-dtype $kv --max-num-seqs $CONC --max-batched-tokens 8192 \
      --max-tokens-limit 4096 --max-queued-requests 4096 --listen-address 127.0.0.1:0 \
      --metrics-address 127.0.0.1:0 --http-address 127.0.0.1:0 ${E2E_EXTRA:-}; then
    echo "server ($kv) did not start"
    continue
  fi
  grep -A12 "startup:" "$log" | head -12
  # The board's SM clock and power while the load runs (a power-capped board slows under load).
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 \
    > "$OUT/smi_$kv.csv" 2>/dev/null &
  smi=$!
  timeout 420 python3 tools/loadgen.py --target 127.0.0.1:$port --proto-python .devpack/python \
    --input-len $IN --output-len $OUTLEN --num-requests $NUM --concurrency $CONC --temperature 0 \
    --backend "${E2E_BACKEND:-grpc}" --base-url "http://127.0.0.1:${hport:-8000}" \
    --no-progress --output-json "$OUT/loadgen_$kv.json" 2>&1 | tail -22 | tee "$OUT/loadgen_$kv.txt"
  kill $smi 2>/dev/null
  python3 - "$OUT/smi_$kv.csv" <<'PY' | tee -a "$OUT/loadgen_$kv.txt"
import sys
rows = []
for line in open(sys.argv[1]):
    try:
        clk, pw = (float(x) for x in line.split(","))
    except ValueError:
        continue
    if pw > 150:  # busy samples only
        rows.append((clk, pw))
if rows:
    q = lambda v, p: sorted(v)[min(len(v) - 1, int(p * len(v)))]
    c, w = [r[0] for r in rows], [r[1] for r in rows]
    print(f"GPU while busy ({len(rows)} samples): SM clock p10/p50/p90 {q(c, .1):.0f}/{q(c, .5):.0f}/"
          f"{q(c, .9):.0f} MHz, power p50/p90 {q(w, .5):.0f}/{q(w, .9):.0f} W")
PY
  # Where each step's time went (engine step-phase histograms: mean per non-empty step).
  [ -n "$mport" ] && python3 - "$mport" <<'PY' | tee "$OUT/step_phases_$kv.txt"
import sys, urllib.request
m = {}
for line in urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode().splitlines():
    if line and not line.startswith("#"):
        k, v = line.rsplit(" ", 1)
        m[k] = float(v)
print(f"decode forwards replayed from CUDA graphs: {int(m.get('llm_engine_graph_steps_total', 0))}")
print(f"steps overlapped with the previous one: {int(m.get('llm_engine_overlapped_steps_total', 0))}")
for p in ("schedule", "prepare", "forward", "sample"):
    n = m.get(f"llm_engine_step_{p}_seconds_count", 0)
    s = m.get(f"llm_engine_step_{p}_seconds_sum", 0)
    print(f"step {p:9s} mean {1e3 * s / max(n, 1):8.3f} ms over {int(n)} steps")
PY
  kill -TERM $pid; wait $pid
done
