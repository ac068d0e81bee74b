#!/usr/bin/env bash
# Runs on the GPU machine: structured-output serving against the same load unconstrained, on one
# server (dummy Llama-3-8B weights behind Llama 3's tokenizer), rounds interleaved:
# STRUCT_REQUESTS requests (default 256) of STRUCT_IN prompt / STRUCT_OUT output tokens at
# STRUCT_CONCURRENCY, every request of a constrained round held to a JSON Schema that cannot
# finish within STRUCT_OUT tokens (an array of at least 1000 integers), so both rounds generate
# the same token counts. Reports and the server log under $OUT; a table last.
# Pack first: ../shared/gpu/pack.sh .devpack build/cuda/server/llm-server; cp -r build/cpu/python
# .devpack/; Llama 3's tokenizer.json as .devpack/tokenizer.json.
set -uo pipefail
source "$(dirname "$0")/server_launch.sh"
OUT="${OUT:-$(pwd)/gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(pwd)/.devpack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NUM="${STRUCT_REQUESTS:-256}"; CONC="${STRUCT_CONCURRENCY:-256}"
IN="${STRUCT_IN:-128}"; OUTLEN="${STRUCT_OUT:-256}"; ROUNDS="${STRUCT_ROUNDS:-2}"
model=/tmp/llama3-8b-dummy
mkdir -p $model && cp configs/models/llama3-8b/config.json $model/ &&
  cp .devpack/tokenizer.json $model/tokenizer.json
cat > "$OUT/schema.json" <<'JSON'
{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"},
 "minItems": 1000}}, "required": ["a"], "additionalProperties": false}
JSON
if ! start_server "$OUT/server.log" .devpack/bin/llm-server --model-dir $model --device cuda \
    --dummy-weights true --max-num-seqs $CONC --max-batched-tokens 8192 \
    --max-queued-requests 4096 --listen-address 127.0.0.1:0 --http-address 127.0.0.1:0; then
  echo "server did not start"
  exit 1
fi
for round in $(seq 1 "$ROUNDS"); do
  for mode in free json; do
    extra=()
    [ "$mode" = json ] && extra=(--json-schema "$OUT/schema.json")
    timeout 300 python3 tools/loadgen.py --target 127.0.0.1:$port --proto-python .devpack/python \
      --input-len "$IN" --output-len "$OUTLEN" --num-requests "$NUM" --concurrency "$CONC" \
      --temperature 1.0 --seed "$round" --no-progress --fail-on-errors \
      --output-json "$OUT/loadgen_${mode}_$round.json" "${extra[@]}" > "$OUT/loadgen_${mode}_$round.txt" 2>&1 ||
      { echo "loadgen $mode round $round failed"; tail -5 "$OUT/loadgen_${mode}_$round.txt"; }
  done
done
[ -n "$mport" ] && curl -s "http://127.0.0.1:$mport/metrics" > "$OUT/metrics.txt"
kill $pid 2>/dev/null
wait $pid 2>/dev/null
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = []
for mode in ("free", "json"):
    tps, ttft, tpot = [], [], []
    for r in range(1, rounds + 1):
        try:
            rep = json.load(open(f"{out}/loadgen_{mode}_{r}.json"))
        except OSError:
            continue
        tps.append(rep["throughput"]["output_token_throughput"])
        ttft.append(rep["latency_ms"]["ttft"]["p50"])
        tpot.append(rep["latency_ms"]["tpot"]["p50"])
    if tps:
        rows.append((mode, sum(tps) / len(tps), sum(ttft) / len(ttft), sum(tpot) / len(tpot), tps))
print("| mode | output tok/s (mean) | TTFT p50 ms | TPOT p50 ms | rounds |")
print("|---|---|---|---|---|")
for mode, t, a, b, all_ in rows:
    print(f"| {mode} | {t:.0f} | {a:.0f} | {b:.2f} | {', '.join(f'{x:.0f}' for x in all_)} |")
if len(rows) == 2:
    print(f"json / free output tok/s: {rows[1][1] / rows[0][1]:.3f}")
# Mean per-step phases over the whole run (both modes; mask: steps with constrained rows only).
try:
    m = {}
    for line in open(f"{out}/metrics.txt"):
        if line.startswith("llm_engine_step_") and ("_sum " in line or "_count " in line):
            k, v = line.split()
            m[k] = float(v)
    for ph in ("schedule", "prepare", "forward", "mask", "sample"):
        n = m.get(f"llm_engine_step_{ph}_seconds_count", 0)
        if n:
            print(f"step {ph}: mean {1e3 * m[f'llm_engine_step_{ph}_seconds_sum'] / n:.2f} ms over {n:.0f} steps")
except OSError:
    pass
PY
