#!/usr/bin/env bash
# Runs on the GPU machine: the OpenAI surface on the CUDA path (dummy Llama-3-8B weights behind
# Llama 3's tokenizer and the Llama 3.2 chat template, which writes tool calls): a forced tool call streamed and whole,
# n = 2 choices, logit_bias forcing a token, a json_schema response. Checks each answer's shape
# (random weights: the content itself means nothing). Results and the server log under $OUT.
# Pack first: ../shared/gpu/pack.sh .devpack build/cuda/server/llm-server, plus Llama 3's
# tokenizer.json as .devpack/tokenizer.json.
set -uo pipefail
source "$(dirname "$0")/server_launch.sh"
OUT="${OUT:-$(pwd)/gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(pwd)/.devpack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
model=/tmp/llama3-8b-dummy
mkdir -p $model && cp configs/models/llama3-8b/config.json $model/ &&
  cp .devpack/tokenizer.json $model/tokenizer.json
if ! start_server "$OUT/server.log" .devpack/bin/llm-server --model-dir $model --device cuda \
    --dummy-weights true --chat-template tests/fixtures/chat_templates/llama3_2.jinja \
    --max-num-seqs 64 --listen-address 127.0.0.1:0 --http-address 127.0.0.1:0; then
  echo "server did not start"
  exit 1
fi
timeout 300 python3 - "http://127.0.0.1:$hport" <<'PY' | tee "$OUT/api_smoke.txt"
import json, sys, urllib.error, urllib.request

base = sys.argv[1]
def post(body, path="/v1/chat/completions"):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:
        sys.exit(f"FAIL {path} {e.code}: {e.read().decode()}")

msgs = [{"role": "user", "content": "Weather in Paris?"}]
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
    "required": ["city"], "additionalProperties": False}}}]
results = []
def check(name, ok, detail=""):
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}")

r = json.loads(post({"messages": msgs, "tools": tools, "tool_choice": "required",
                     "max_tokens": 64, "parallel_tool_calls": False}))
calls = r["choices"][0]["message"].get("tool_calls") or []
check("forced call", len(calls) == 1 and json.loads(calls[0]["function"]["arguments"])["city"]
      in ("Paris", "Oslo") and r["choices"][0]["finish_reason"] == "tool_calls", calls)
text = post({"messages": msgs, "tools": tools, "tool_choice": "required", "max_tokens": 64,
             "parallel_tool_calls": False, "stream": True})
events = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
deltas = [c["delta"] for e in events for c in e["choices"]]
args = "".join(t["function"].get("arguments", "") for d in deltas for t in d.get("tool_calls", []))
check("forced call streamed", json.loads(args)["city"] in ("Paris", "Oslo") and
      all("get_weather" not in d.get("content", "") for d in deltas), args)
r = json.loads(post({"messages": msgs, "n": 2, "max_tokens": 16, "temperature": 1.0, "seed": 5,
                     "ignore_eos": True}))
check("n = 2", [c["index"] for c in r["choices"]] == [0, 1] and
      r["usage"]["completion_tokens"] == 32, r["usage"])
tok = json.loads(post({"prompt": " the", "add_special_tokens": False}, "/tokenize"))["tokens"][0]
r = json.loads(post({"messages": msgs, "max_tokens": 8, "logit_bias": {str(tok): 100},
                     "logprobs": True, "ignore_eos": True}))
ids = [c.get("token", "") for c in r["choices"][0]["logprobs"]["content"]]
check("logit_bias forces one token", len(ids) == 8 and len(set(ids)) == 1, ids[:3])
schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
          "maximum": 9}}, "required": ["n"], "additionalProperties": False}
r = json.loads(post({"messages": msgs, "max_tokens": 64, "response_format": {
    "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}}))
v = json.loads(r["choices"][0]["message"]["content"])
check("json_schema", set(v) == {"n"} and 0 <= v["n"] <= 9, v)
print(f"{sum(ok for _, ok in results)}/{len(results)} API checks passed")
PY
kill $pid 2>/dev/null
wait $pid 2>/dev/null
