// The speculative-decoding tests' shared pieces (CPU, tiny random checkpoints): one tiny model
// of each architecture family, a greedy workload whose prompts repeat themselves (the n-gram
// proposer finds drafts in it) with stop tokens, logprobs, an opted-out request and penalties, and
// a driver that runs requests through EngineCore to the end and checks that every KV block came
// back and every request ended once.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device_sampling_model.h"
#include "engine/engine_core.h"
#include "engine/speculative/draft_model_proposer.h"
#include "tiny_checkpoint.h"

namespace llm::spec_test {

struct Sink : ResultSink {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int finals = 0;
  FinishReason reason = FinishReason::kNone;
  int completion_tokens = -1;
  void OnOutput(GenerationOutput o) override {
    tokens.insert(tokens.end(), o.token_ids.begin(), o.token_ids.end());
    for (const SampledToken& t : o.logprobs) logprobs.push_back(t.logprob);
    if (o.finished || !o.error.ok()) {
      ++finals;
      reason = o.finish_reason;
      completion_tokens = o.usage.completion_tokens;
    }
  }
};

// Qwen3: Llama's layout with per-head q/k RMSNorms.
inline test::TinyCheckpoint TinyQwen3() {
  test::TinyCheckpoint c = test::TinyLlama("llama", 5);
  c.config["architectures"] = {"Qwen3ForCausalLM"};
  c.config["model_type"] = "qwen3";
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    c.AddF32(p + "q_norm.weight", {8}, 1, 0.1f, 700 + l);
    c.AddF32(p + "k_norm.weight", {8}, 1, 0.1f, 710 + l);
  }
  return c;
}

// Mixtral: every layer's MLP is 4 experts, top 2.
inline test::TinyCheckpoint TinyMixtral() {
  test::TinyCheckpoint c = test::TinyLlama("llama", 6);
  c.config["architectures"] = {"MixtralForCausalLM"};
  c.config["model_type"] = "mixtral";
  c.config["num_local_experts"] = 4;
  c.config["num_experts_per_tok"] = 2;
  uint32_t s = 900;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* m : {"gate_proj", "up_proj", "down_proj"})
      c.Remove(p + "mlp." + m + ".weight");
    c.AddF32(p + "block_sparse_moe.gate.weight", {4, 32}, 0, 1.0f, ++s);
    for (int e = 0; e < 4; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      c.AddF32(x + "w1.weight", {48, 32}, 0, 0.3f, ++s);
      c.AddF32(x + "w3.weight", {48, 32}, 0, 0.3f, ++s);
      c.AddF32(x + "w2.weight", {32, 48}, 0, 0.3f, ++s);
    }
  }
  return c;
}

// DeepSeek-V3: MLA, one dense layer then MoE layers (8 routed experts in 4 groups, top 2, one
// shared expert) with random routers.
inline test::TinyCheckpoint TinyDeepseekV3() {
  test::TinyCheckpoint c = test::TinyDeepseekV2(7);
  c.config.update({{"architectures", {"DeepseekV3ForCausalLM"}},
                   {"model_type", "deepseek_v3"},
                   {"moe_intermediate_size", 8},
                   {"n_routed_experts", 8},
                   {"n_shared_experts", 1},
                   {"num_experts_per_tok", 2},
                   {"routed_scaling_factor", 2.5},
                   {"scoring_func", "sigmoid"},
                   {"topk_method", "noaux_tc"},
                   {"n_group", 4},
                   {"topk_group", 2},
                   {"norm_topk_prob", true},
                   {"first_k_dense_replace", 1},
                   {"moe_layer_freq", 1},
                   {"rope_theta", 10000.0},
                   {"rope_scaling", nullptr},
                   {"attention_bias", false}});
  const std::string p = "model.layers.1.mlp.";
  for (const char* m : {"gate_proj", "up_proj", "down_proj"}) c.Remove(p + m + ".weight");
  uint32_t s = 1300;
  c.AddF32(p + "gate.weight", {8, 32}, 0, 1.0f, ++s);
  c.AddF32(p + "gate.e_score_correction_bias", {8}, 0, 0.1f, ++s);
  auto mlp = [&](const std::string& x) {
    c.AddF32(x + "gate_proj.weight", {8, 32}, 0, 0.3f, ++s);
    c.AddF32(x + "up_proj.weight", {8, 32}, 0, 0.3f, ++s);
    c.AddF32(x + "down_proj.weight", {32, 8}, 0, 0.3f, ++s);
  };
  for (int e = 0; e < 8; ++e) mlp(p + "experts." + std::to_string(e) + ".");
  mlp(p + "shared_experts.");
  return c;
}

// Gemma 2: (1 + w) norms, four per layer, GeGLU, soft-capped attention and logits, a sliding
// layer then a global one, tied embeddings.
inline test::TinyCheckpoint TinyGemma2() {
  test::TinyCheckpoint c = test::TinyLlama("llama", 8);
  c.config.erase("hidden_act");
  c.config.update({{"architectures", {"Gemma2ForCausalLM"}},
                   {"model_type", "gemma2"},
                   {"hidden_activation", "gelu_pytorch_tanh"},
                   {"query_pre_attn_scalar", 8},
                   {"attn_logit_softcapping", 50.0},
                   {"final_logit_softcapping", 30.0},
                   {"sliding_window", 6},
                   {"layer_types", {"sliding_attention", "full_attention"}},
                   {"tie_word_embeddings", true}});
  c.Remove("lm_head.weight");
  uint32_t s = 1700;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    c.AddF32(p + "pre_feedforward_layernorm.weight", {32}, 0, 0.1f, ++s);
    c.AddF32(p + "post_feedforward_layernorm.weight", {32}, 0, 0.1f, ++s);
  }
  return c;
}

struct Family {
  std::string name;
  std::function<test::TinyCheckpoint()> make;
};

inline std::vector<Family> Families() {
  return {
      {"llama", [] { return test::TinyLlama("llama"); }},
      {"qwen2", [] { return test::TinyLlama("qwen2", 2); }},
      {"mistral (sliding window 6)",
       [] {
         test::TinyCheckpoint c = test::TinyLlama("mistral", 3);
         c.config["sliding_window"] = 6;
         return c;
       }},
      {"qwen3", TinyQwen3},
      {"gemma2 (soft-caps, a sliding layer)", TinyGemma2},
      {"mixtral (MoE)", TinyMixtral},
      {"deepseek_v2 (MLA)", [] { return test::TinyDeepseekV2(); }},
      {"deepseek_v3 (MLA + MoE)", TinyDeepseekV3},
  };
}

// The engine settings the speculative tests share: the checkpoint in `dir`, blocks of 4 tokens,
// 8 sequences, a small token budget (so that prompts are chunked beside verify steps), no
// tokenizer, speculation `method` with K = k.
inline EngineConfig SpeculativeTestConfig(const std::string& dir, const std::string& method, int k,
                                          int num_blocks, int max_batched_tokens) {
  EngineConfig cfg;
  cfg.model.model_dir = dir;
  cfg.model.block_size = 4;
  cfg.model.num_kv_blocks = num_blocks;
  cfg.scheduler.max_num_seqs = 8;
  cfg.scheduler.max_batched_tokens = max_batched_tokens;
  cfg.require_tokenizer = false;
  cfg.speculative.method = method;
  cfg.speculative.num_speculative_tokens = k;
  return cfg;
}

// An engine over the checkpoint in `dir` (a token budget of 24) with speculation `method`; a
// draft model from `draft_dir` for the draft method; `adaptive`: --speculative-adaptive-k.
inline std::unique_ptr<EngineCore> MakeCore(const std::string& dir, const std::string& method,
                                            int k, int num_blocks = 96,
                                            int disable_by_batch_size = 0,
                                            const std::string& draft_dir = "",
                                            bool adaptive = false) {
  EngineConfig cfg = SpeculativeTestConfig(dir, method, k, num_blocks, 24);
  cfg.speculative.disable_by_batch_size = disable_by_batch_size;
  cfg.speculative.draft_model_dir = draft_dir;
  cfg.speculative.adaptive_draft_length = adaptive;
  auto core = EngineCore::Create(cfg);
  INFO(core.status().ToString());
  REQUIRE(core.ok());
  return std::move(core.value());
}

// Target and draft as models that sample on the device (as the CUDA runner does), the target
// overlapping steps, over the tiny Llama in `dir` (block size 4); speculation `method`, the target
// itself as the draft model. With draft_overlap the draft model overlaps steps too (its proposal
// forwards queued behind each other); fail_launch / fail_collect inject a failure into the draft
// model's calls.
struct DeviceCoreOptions {
  int num_blocks = 128;
  int disable_by_batch_size = 32;
  bool draft_overlap = false;
  int fail_launch = -1, fail_collect = -1;
};

inline std::unique_ptr<EngineCore> MakeDeviceSamplingCore(const std::string& dir,
                                                          const std::string& method,
                                                          const DeviceCoreOptions& o = {}) {
  EngineConfig cfg = SpeculativeTestConfig(dir, method, 3, o.num_blocks, 32);
  cfg.speculative.disable_by_batch_size = o.disable_by_batch_size;
  std::unique_ptr<Model> draft;
  if (method == "draft") {
    cfg.speculative.draft_model_dir = dir;
    auto loaded = LoadModel(DraftModelLoadOptions(cfg.model, dir));
    REQUIRE(loaded.ok());
    auto d =
        std::make_unique<test::DeviceSamplingModel>(std::move(loaded).value(), o.draft_overlap);
    d->fail_launch = o.fail_launch;
    d->fail_collect = o.fail_collect;
    draft = std::move(d);
  }
  auto target = LoadModel(cfg.model);
  REQUIRE(target.ok());
  auto core = EngineCore::Create(
      cfg, std::make_unique<test::DeviceSamplingModel>(std::move(target).value(), true),
      std::move(draft));
  INFO(core.status().ToString());
  REQUIRE(core.ok());
  return std::move(core.value());
}

inline const test::DeviceSamplingModel& DeviceDraft(const EngineCore& core) {
  const auto* d = dynamic_cast<const test::DeviceSamplingModel*>(core.draft_model());
  REQUIRE(d != nullptr);
  return *d;
}

// The target of an engine made by MakeDeviceSamplingCore.
inline const test::DeviceSamplingModel& DeviceTarget(const EngineCore& core) {
  const auto* t = dynamic_cast<const test::DeviceSamplingModel*>(&core.model());
  REQUIRE(t != nullptr);
  return *t;
}

// Prompts that repeat themselves, so that the n-gram proposer finds drafts.
inline std::vector<GenerationRequest> GreedyWorkload(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.request_id = "r" + std::to_string(i);
    std::vector<int32_t> motif;
    const int motif_len = 2 + static_cast<int>(rng() % 5);
    for (int t = 0; t < motif_len; ++t) motif.push_back(2 + static_cast<int32_t>(rng() % 60));
    const int repeats = 2 + static_cast<int>(rng() % 4);
    for (int x = 0; x < repeats; ++x)
      r.prompt_ids.insert(r.prompt_ids.end(), motif.begin(), motif.end());
    r.sampling.temperature = 0.0f;
    r.stopping.max_tokens = 12 + static_cast<int>(rng() % 30);
    r.stopping.ignore_eos = i % 2 == 0;
    if (i == 1) r.stopping.stop_token_ids.push_back(motif[1]);  // may stop inside a verify step
    if (i == 3) r.sampling.logprobs = 2;
    if (i == 4) r.speculative_decoding = false;  // opted out: a plain decode beside the others
    if (i == 5) {
      r.sampling.repetition_penalty = 1.1f;  // a processed distribution, still greedy
      r.sampling.logit_bias = {{motif[0], 1.5f}};
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct RunResult {
  std::map<std::string, std::shared_ptr<Sink>> sinks;
  int drafts = 0, draft_tokens = 0, accepted = 0;
};

inline RunResult Run(EngineCore& core, const std::vector<GenerationRequest>& reqs,
                     const std::map<int, std::string>& abort_at = {}) {
  const int baseline = core.num_free_blocks();
  RunResult res;
  for (GenerationRequest r : reqs) {
    REQUIRE(core.Validate(&r).ok());
    auto sink = std::make_shared<Sink>();
    res.sinks[r.request_id] = sink;
    core.Add(std::move(r), sink);
  }
  int step = 0;
  for (; core.HasWork() && step < 5000; ++step) {
    auto it = abort_at.find(step);
    if (it != abort_at.end()) core.Abort(it->second, Status::Ok());
    const StepRecord rec = core.Step();
    res.drafts += rec.num_drafts;
    res.draft_tokens += rec.num_draft_tokens;
    res.accepted += rec.num_accepted_tokens;
  }
  REQUIRE(step < 5000);
  // Every block back (cached prefix blocks count as free), every request ended once.
  CHECK(core.num_free_blocks() == baseline);
  CHECK(core.num_running() == 0);
  CHECK(core.num_waiting() == 0);
  for (const auto& [id, sink] : res.sinks) {
    INFO(id);
    CHECK(sink->finals == 1);
    if (sink->reason != FinishReason::kAborted) {
      CHECK(sink->completion_tokens == static_cast<int>(sink->tokens.size()));
    }
  }
  return res;
}

// The sampled-distribution tests' requests: 1,500 of `prompt`, 3 tokens each (room for one draft
// after the first), top 8 at temperature 1.5 with `bias` on the prompt's tokens {2, 10, 11, 12}
// (so that drafts are likely), seeds seed0, seed0 + 1, ...
inline std::vector<GenerationRequest> SampledWorkload(const std::vector<int32_t>& prompt,
                                                      float bias, uint64_t seed0) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 1500; ++i) {
    GenerationRequest r;
    r.request_id = "s" + std::to_string(i);
    r.prompt_ids = prompt;
    r.sampling.top_k = 8;
    r.sampling.seed = seed0 + static_cast<uint64_t>(i);
    r.sampling.temperature = 1.5f;
    r.sampling.logit_bias = {{2, bias}, {10, bias}, {11, bias}, {12, bias}};
    r.stopping.max_tokens = 3;
    r.stopping.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// How often each token came second in a run of SampledWorkload.
inline std::map<int32_t, int> SecondTokens(const RunResult& res) {
  std::map<int32_t, int> second;
  for (const auto& [id, sink] : res.sinks) {
    REQUIRE(sink->tokens.size() == 3);
    second[sink->tokens[1]]++;
  }
  return second;
}

// Chi-square test of homogeneity of two equal-sized samples over the tokens seen at least 10 times
// in all, the rest pooled: fails above the p = 0.001 critical value (Wilson-Hilferty).
inline void CheckSameDistribution(const std::map<int32_t, int>& plain,
                                  const std::map<int32_t, int>& spec, const std::string& context) {
  std::map<int32_t, std::pair<int, int>> cells;
  for (const auto& [t, c] : plain) cells[t].first += c;
  for (const auto& [t, c] : spec) cells[t].second += c;
  std::map<int32_t, std::pair<int, int>> pooled;
  for (const auto& [t, ab] : cells) {
    auto& cell = pooled[ab.first + ab.second >= 10 ? t : -1];
    cell.first += ab.first;
    cell.second += ab.second;
  }
  double chi2 = 0;
  for (const auto& [t, ab] : pooled) {
    const double e = (ab.first + ab.second) / 2.0;  // equal sample sizes
    chi2 += (ab.first - e) * (ab.first - e) / e + (ab.second - e) * (ab.second - e) / e;
  }
  const int df = static_cast<int>(pooled.size()) - 1;
  INFO("chi2 " << chi2 << " over " << df << " degrees of freedom; " << context);
  REQUIRE(df >= 2);
  const double z = 3.090;
  const double h = 2.0 / (9.0 * df);
  CHECK(chi2 < df * std::pow(1 - h + z * std::sqrt(h), 3));
}

}  // namespace llm::spec_test
