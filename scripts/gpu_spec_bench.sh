#!/usr/bin/env bash
# Runs on the GPU machine: speculative decoding on the trained code model (issue 52), one server
# per configuration, the code-editing workload (bench/workloads/code_edit.jsonl: prompts that
# hold most of what the model writes) greedy at concurrency 1 (batch-1 TPOT), then random prompts
# at SPEC_HIGH_CONC (default 256; speculation pauses above --speculative-disable-by-batch-size,
# so it must cost nothing there; SPEC_HIGH_REQUESTS requests, default twice the concurrency). Configurations: SPEC_CONFIGS, space-separated, each "none",
# "ngram:K" or "draft:K" (draft: the fixture's code_llama_draft). Reports and server logs under
# $OUT; a table last. SPEC_ROUNDS (default 1) repeats the configurations in turn, each on a fresh
# server (one launch-bound server against the next drifts by up to a third): the edit workload every
# round, the high-concurrency run in round 1 only (SPEC_HIGH_REQUESTS=0 skips it); the table gives
# each round's ratios and their median.
# Pack first: ../shared/gpu/pack.sh .devpack build/cuda/server/llm-server; cp -r build/cpu/python
# .devpack/.
set -uo pipefail
source "$(dirname "$0")/server_launch.sh"
OUT="${OUT:-$(pwd)/gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(pwd)/.devpack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CONFIGS="${SPEC_CONFIGS:-none ngram:2 ngram:3 ngram:4 draft:3}"
HIGH="${SPEC_HIGH_CONC:-256}"
SERVER="${SPEC_SERVER:-.devpack/bin/llm-server}"  # SPEC_SERVER / SPEC_DEVICE: try it on a CPU build
DEVICE="${SPEC_DEVICE:-cuda}"
PROTO="${SPEC_PROTO:-.devpack/python}"
target="${SPEC_TARGET:-tests/fixtures/models/code_llama}"
draft="${SPEC_DRAFT:-tests/fixtures/models/code_llama_draft}"
WORKLOAD="${SPEC_WORKLOAD:-bench/workloads/code_edit.jsonl}"
ROUNDS="${SPEC_ROUNDS:-1}"
HIGH_REQUESTS="${SPEC_HIGH_REQUESTS:-$((2 * HIGH))}"
for round in $(seq 1 "$ROUNDS"); do
for cfg in $CONFIGS; do
  method=${cfg%%:*}
  k=${cfg#*:}
  tag=${cfg/:/_}
  [ "$ROUNDS" -gt 1 ] && tag="${tag}_r$round"
  args=()
  if [ "$method" = ngram ]; then
    args=(--speculative-method ngram --num-speculative-tokens "$k")
  elif [ "$method" = draft ]; then
    args=(--speculative-method draft --num-speculative-tokens "$k" --speculative-model "$draft")
  fi
  if ! start_server "$OUT/server_$tag.log" "$SERVER" --model-dir $target \
      --device "$DEVICE" --max-num-seqs 512 --max-batched-tokens 8192 --max-queued-requests 4096 \
      --listen-address 127.0.0.1:0 --http-address 127.0.0.1:0 "${args[@]}"; then
    echo "$cfg: server did not start"
    continue
  fi
  metrics=()
  [ -n "$mport" ] && metrics=(--metrics-url "http://127.0.0.1:$mport/metrics")
  timeout 300 "${PYTHON:-python3}" tools/loadgen.py --target 127.0.0.1:$port --proto-python "$PROTO" \
    --dataset "$WORKLOAD" --concurrency 1 --temperature 0 --no-progress \
    --fail-on-errors --output-json "$OUT/edit_$tag.json" "${metrics[@]}" \
    > "$OUT/edit_$tag.txt" 2>&1 || { echo "$cfg: edit workload failed"; tail -5 "$OUT/edit_$tag.txt"; }
  # Where a batch-1 step's time went (engine step-phase histograms, the edit workload alone).
  [ -n "$mport" ] && python3 - "$mport" <<'PY' > "$OUT/phases_$tag.txt"
import sys, urllib.request
m = {}
for line in urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode().splitlines():
    if line and not line.startswith("#"):
        k, v = line.rsplit(" ", 1)
        m[k] = float(v)
print(f"graph steps {int(m.get('llm_engine_graph_steps_total', 0))}, "
      f"overlapped {int(m.get('llm_engine_overlapped_steps_total', 0))}")
for p in ("schedule", "prepare", "forward", "sample", "draft", "verify"):
    n = m.get(f"llm_engine_step_{p}_seconds_count", 0)
    s = m.get(f"llm_engine_step_{p}_seconds_sum", 0)
    print(f"step {p:9s} mean {1e3 * s / max(n, 1):8.4f} ms over {int(n)} steps")
PY
  if [ "$round" = 1 ] && [ "$HIGH_REQUESTS" -gt 0 ]; then
    timeout 300 "${PYTHON:-python3}" tools/loadgen.py --target 127.0.0.1:$port --proto-python "$PROTO" \
      --input-len 128 --output-len 256 --num-requests "$HIGH_REQUESTS" --concurrency "$HIGH" \
      --temperature 0 --no-progress --fail-on-errors --output-json "$OUT/high_$tag.json" \
      "${metrics[@]}" > "$OUT/high_$tag.txt" 2>&1 ||
      { echo "$cfg: high-concurrency run failed"; tail -5 "$OUT/high_$tag.txt"; }
  fi
  kill $pid 2>/dev/null
  wait $pid 2>/dev/null
done
done
python3 - "$OUT" "$ROUNDS" $CONFIGS <<'PY'
import json, statistics, sys
out, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"| round | config | edit TPOT p50 ms | edit tok/s | acceptance | accepted per verify | "
      f"c=high tok/s | c=high TPOT p50 ms |")
print("|---|---|---|---|---|---|---|---|")
ratios = {}
for r in range(1, rounds + 1):
    base = None
    for cfg in configs:
        tag = cfg.replace(":", "_") + (f"_r{r}" if rounds > 1 else "")
        try:
            e = json.load(open(f"{out}/edit_{tag}.json"))
        except OSError:
            print(f"| {r} | {cfg} | failed | | | | | |")
            continue
        try:
            h = json.load(open(f"{out}/high_{tag}.json"))
            high = (f"{h['throughput']['output_token_throughput']:.0f} | "
                    f"{h['latency_ms']['tpot']['p50']:.3f}")
        except OSError:
            high = "- | -"
        sd = e.get("speculative_decoding") or {}
        rate = sd.get("acceptance_rate")
        mean = sd.get("mean_accepted_tokens")
        tpot = e["latency_ms"]["tpot"]["p50"]
        if cfg == "none":
            base = tpot
        speed = ""
        if base and cfg != "none":
            ratios.setdefault(cfg, []).append(base / tpot)
            speed = f" ({base / tpot:.2f}x)"
        print(f"| {r} | {cfg} | {tpot:.3f}{speed} | {e['throughput']['output_token_throughput']:.0f} | "
              f"{'-' if rate is None else f'{100 * rate:.1f}%'} | "
              f"{'-' if mean is None else f'{mean:.2f}'} | {high} |")
for cfg, v in ratios.items():
    print(f"{cfg}: batch-1 TPOT over none, median of {len(v)} round(s) {statistics.median(v):.2f}x "
          f"(each: {', '.join(f'{x:.2f}' for x in v)})")
PY
for cfg in $CONFIGS; do
  echo "phases, edit workload, $cfg:"
  cat "$OUT"/phases_${cfg/:/_}*.txt 2>/dev/null
done
