// Drives the engine step by step on token-id prompts with greedy decoding and writes every
// sampled position's logits and the per-step batch composition as JSON. The PyTorch reference
// test (tests/python/test_forward_vs_torch.py) compares these against its own forward pass.
//
//   llm-dump --model DIR --requests REQ.json --out OUT.json [--block-size 16]
//            [--max-batched-tokens 32] [--max-num-seqs 8] [--num-blocks 256]
//            [--kv-cache-dtype auto|int8|fp8_e4m3|fp8_e4m3_dynamic]
//            [--kv-scale-granularity per_head|per_channel] [--kv-scales-file SCALES.json]
//            [--logits-top-k K] [--device cpu|cuda] [--weight-dtype auto|bf16|fp8]
//            [--routing-out ROUTING.json]
// --logits-top-k K writes only each position's K largest logits as [token, logit] pairs (large
// vocabularies make the full rows hundreds of megabytes).
// --routing-out FILE (MoE models): every routed expert set the model chose, per request, as
// [position, layer, [experts ascending]] rows ordered by position then layer (a position
// recomputed after a preemption keeps its last decision); tools/hf_fixtures/gpu_fidelity.py
// compares them with transformers' own routing.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "engine/engine_core.h"

namespace {

using json = nlohmann::json;

struct Collector : llm::ResultSink {
  std::vector<int32_t>* out_ids;
  bool* done;
  std::string* error;
  void OnOutput(llm::GenerationOutput o) override {
    out_ids->insert(out_ids->end(), o.token_ids.begin(), o.token_ids.end());
    if (!o.error.ok()) *error = o.error.ToString();
    if (o.finished || !o.error.ok()) *done = true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (!args.count("--model") || !args.count("--requests") || !args.count("--out")) {
    std::fprintf(stderr,
                 "usage: %s --model DIR --requests REQ.json --out OUT.json "
                 "[--block-size N] [--max-batched-tokens N] [--max-num-seqs N] "
                 "[--num-blocks N] [--kv-cache-dtype T] [--kv-scale-granularity G] "
                 "[--kv-scales-file F] [--logits-top-k K] [--device D] [--weight-dtype W] "
                 "[--routing-out F]\n",
                 argv[0]);
    return 2;
  }
  auto get = [&](const char* k, int def) {
    return args.count(k) ? std::atoi(args[k].c_str()) : def;
  };
  spdlog::set_level(spdlog::level::warn);

  llm::EngineConfig cfg;
  cfg.model.model_dir = args["--model"];
  cfg.model.block_size = get("--block-size", 16);
  cfg.model.num_kv_blocks = get("--num-blocks", 256);
  cfg.scheduler.max_batched_tokens = get("--max-batched-tokens", 32);
  cfg.scheduler.max_num_seqs = get("--max-num-seqs", 8);
  cfg.require_tokenizer = false;
  if (args.count("--kv-cache-dtype")) cfg.model.kv_cache_dtype = args["--kv-cache-dtype"];
  if (args.count("--kv-scale-granularity")) {
    cfg.model.kv_scale_granularity = args["--kv-scale-granularity"];
  }
  if (args.count("--kv-scales-file")) cfg.model.kv_scales_file = args["--kv-scales-file"];
  if (args.count("--device")) cfg.model.device = args["--device"];
  if (args.count("--weight-dtype")) cfg.model.weight_dtype = args["--weight-dtype"];
  auto core_or = llm::EngineCore::Create(cfg);
  if (!core_or.ok()) {
    std::fprintf(stderr, "llm-dump: %s\n", core_or.status().ToString().c_str());
    return 1;
  }
  auto& core = *core_or.value();

  std::ifstream in(args["--requests"]);
  json req = json::parse(in, nullptr, false);
  if (req.is_discarded()) {
    std::fprintf(stderr, "llm-dump: cannot parse %s\n", args["--requests"].c_str());
    return 1;
  }
  const int max_new = req.value("max_new_tokens", 32);
  const size_t n = req["requests"].size();
  std::vector<std::vector<int32_t>> outputs(n);
  std::vector<json> logits(n, json::array());
  std::vector<char> done(n, 0);
  std::vector<std::string> errors(n);
  const int top_k = get("--logits-top-k", 0);
  core.set_logits_observer([&](const std::string& id, std::span<const float> l) {
    if (top_k <= 0) {
      logits[std::stoul(id)].push_back(std::vector<float>(l.begin(), l.end()));
      return;
    }
    std::vector<int32_t> order(l.size());
    for (size_t t = 0; t < order.size(); ++t) order[t] = static_cast<int32_t>(t);
    const size_t k = std::min(order.size(), static_cast<size_t>(top_k));
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    json row = json::array();
    for (size_t t = 0; t < k; ++t) row.push_back({order[t], l[order[t]]});
    logits[std::stoul(id)].push_back(std::move(row));
  });

  // routing[request][(position, layer)] = experts
  std::vector<std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>>> routing(n);
  if (args.count("--routing-out")) {
    const llm::Status st =
        core.set_routing_observer([&](const std::string& id, const llm::MoeRoutingDecision& d) {
          routing[std::stoul(id)][{d.position, d.layer}] = d.experts;
        });
    if (!st.ok()) {
      std::fprintf(stderr, "llm-dump: --routing-out: %s\n", st.ToString().c_str());
      return 1;
    }
  }

  json steps = json::array();
  size_t finished = 0;
  for (int step = 0; finished < n && step < 100000; ++step) {
    for (size_t i = 0; i < n; ++i) {
      const json& r = req["requests"][i];
      if (r.value("arrival_step", 0) != step) continue;
      llm::GenerationRequest g;
      g.request_id = std::to_string(i);
      g.prompt_ids = r["prompt_ids"].get<std::vector<int32_t>>();
      g.sampling.temperature = 0.0f;
      g.stopping.max_tokens = max_new;
      g.stopping.ignore_eos = true;
      llm::Status st = core.Validate(&g);
      if (!st.ok()) {
        std::fprintf(stderr, "llm-dump: request %zu: %s\n", i, st.ToString().c_str());
        return 1;
      }
      auto sink = std::make_shared<Collector>();
      sink->out_ids = &outputs[i];
      sink->done = reinterpret_cast<bool*>(&done[i]);
      sink->error = &errors[i];
      core.Add(std::move(g), sink);
    }
    const llm::StepRecord rec = core.Step();
    json seqs = json::array();
    for (const auto& e : rec.entries) {
      seqs.push_back({{"request", std::stoi(e.request_id)},
                      {"num_tokens", e.num_tokens},
                      {"is_prefill", e.is_prefill},
                      {"prefill_done", e.prefill_done}});
    }
    steps.push_back({{"step", step}, {"seqs", seqs}, {"preempted", rec.num_preempted}});
    finished = 0;
    for (size_t i = 0; i < n; ++i) finished += done[i] ? 1 : 0;
  }
  json out = {{"requests", json::array()}, {"steps", steps}};
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) {
      std::fprintf(stderr, "llm-dump: request %zu failed: %s\n", i, errors[i].c_str());
      return 1;
    }
    out["requests"].push_back({{"prompt_ids", req["requests"][i]["prompt_ids"]},
                               {"output_ids", outputs[i]},
                               {"logits", logits[i]}});
  }
  std::ofstream(args["--out"]) << out.dump();
  if (args.count("--routing-out")) {
    json r = {{"requests", json::array()}};
    for (size_t i = 0; i < n; ++i) {
      json rows = json::array();
      for (const auto& [key, experts] : routing[i])
        rows.push_back({key.first, key.second, experts});
      r["requests"].push_back({{"routing", rows}});
    }
    std::ofstream(args["--routing-out"]) << r.dump();
  }
  return 0;
}
