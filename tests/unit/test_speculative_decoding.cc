// Speculative decoding through EngineCore on tiny random checkpoints of each architecture family
// (CPU): greedy output with n-gram drafts is exactly the output without them, drafts are really
// accepted, stop conditions cut a step's accepted tokens, sampled requests keep their distribution
// end to end, and every KV block comes back (aborts included).
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

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
test::TinyCheckpoint TinyQwen3() {
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
test::TinyCheckpoint TinyMixtral() {
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
test::TinyCheckpoint TinyDeepseekV3() {
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
test::TinyCheckpoint TinyGemma2() {
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

std::vector<Family> Families() {
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

std::unique_ptr<EngineCore> MakeCore(const std::string& dir, const std::string& method, int k,
                                     int num_blocks = 96, int disable_by_batch_size = 0) {
  EngineConfig cfg;
  cfg.model.model_dir = dir;
  cfg.model.block_size = 4;
  cfg.model.num_kv_blocks = num_blocks;
  cfg.scheduler.max_num_seqs = 8;
  cfg.scheduler.max_batched_tokens = 24;  // chunked prompts beside verify steps
  cfg.require_tokenizer = false;
  cfg.speculative.method = method;
  cfg.speculative.num_speculative_tokens = k;
  cfg.speculative.disable_by_batch_size = disable_by_batch_size;
  auto core = EngineCore::Create(cfg);
  REQUIRE(core.ok());
  return std::move(core.value());
}

// Prompts that repeat themselves, so that the n-gram proposer finds drafts.
std::vector<GenerationRequest> GreedyWorkload(uint32_t seed) {
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

RunResult Run(EngineCore& core, const std::vector<GenerationRequest>& reqs,
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

TEST_CASE("greedy decoding with n-gram drafts gives exactly the tokens without them",
          "[speculative][engine]") {
  for (const Family& f : Families()) {
    for (int k : {1, 4}) {
      INFO(f.name << ", K = " << k);
      test::TempDir dir("spec_exact");
      f.make().Write(dir.path());
      const std::vector<GenerationRequest> reqs = GreedyWorkload(17 + k);
      auto plain_core = MakeCore(dir.path().string(), "none", k);
      const RunResult plain = Run(*plain_core, reqs);
      auto spec_core = MakeCore(dir.path().string(), "ngram", k);
      const RunResult spec = Run(*spec_core, reqs);
      CHECK(plain.drafts == 0);
      CHECK(spec.drafts > 0);
      CHECK(spec.accepted > 0);  // drafts were really accepted, so steps emitted several tokens
      CHECK(spec.draft_tokens <= spec.drafts * k);
      for (const auto& [id, sink] : plain.sinks) {
        INFO(id);
        const Sink& s = *spec.sinks.at(id);
        CHECK(s.tokens == sink->tokens);
        CHECK(s.reason == sink->reason);
        REQUIRE(s.logprobs.size() == sink->logprobs.size());
        for (size_t i = 0; i < s.logprobs.size(); ++i) {
          CHECK(s.logprobs[i] == Approx(sink->logprobs[i]).margin(1e-4));
        }
      }
    }
  }
}

// disable_by_batch_size: while more requests than the limit run or wait, no step drafts; once
// enough have finished, drafting resumes; the tokens are those without speculation throughout.
TEST_CASE("speculation pauses above disable_by_batch_size and resumes below it",
          "[speculative][engine]") {
  test::TempDir dir("spec_pause");
  test::TinyDeepseekV2().Write(dir.path());
  const std::vector<GenerationRequest> reqs = GreedyWorkload(5);
  auto plain_core = MakeCore(dir.path().string(), "none", 3);
  const RunResult plain = Run(*plain_core, reqs);
  auto core = MakeCore(dir.path().string(), "ngram", 3, 96, /*disable_by_batch_size=*/2);
  const int baseline = core->num_free_blocks();
  std::map<std::string, std::shared_ptr<Sink>> sinks;
  for (GenerationRequest r : reqs) {
    REQUIRE(core->Validate(&r).ok());
    sinks[r.request_id] = std::make_shared<Sink>();
    core->Add(std::move(r), sinks[r.request_id]);
  }
  int drafts_while_busy = 0, drafts_after = 0;
  for (int step = 0; core->HasWork() && step < 5000; ++step) {
    const int load = core->num_running() + core->num_waiting();  // what the step's drafts see
    const StepRecord rec = core->Step();
    (load > 2 ? drafts_while_busy : drafts_after) += rec.num_drafts;
  }
  CHECK(drafts_while_busy == 0);
  CHECK(drafts_after > 0);
  CHECK(core->num_free_blocks() == baseline);
  for (const auto& [id, sink] : plain.sinks) {
    INFO(id);
    CHECK(sinks.at(id)->tokens == sink->tokens);
  }
}

// A model that samples on the device and overlaps steps (the synthetic one, whose token is a hash
// of the fed-back id and the position; a vocabulary of 5 makes drafts match by chance): drafted
// rows come back as logits while the other rows of the step are sampled on the device, requests
// that opt out still overlap once no speculating request is in the batch, and every token is the
// one of a run without speculation.
TEST_CASE("speculation beside device sampling and overlapped steps changes no token",
          "[speculative][engine]") {
  auto make = [](const std::string& method) {
    EngineConfig cfg;
    cfg.model.model_dir = "synthetic:vocab=5,max_len=512,device_sampling=1";
    cfg.model.block_size = 4;
    cfg.model.num_kv_blocks = 128;
    cfg.scheduler.max_num_seqs = 8;
    cfg.scheduler.max_batched_tokens = 32;
    cfg.require_tokenizer = false;
    cfg.speculative.method = method;
    cfg.speculative.num_speculative_tokens = 4;
    auto core = EngineCore::Create(cfg);
    REQUIRE(core.ok());
    return std::move(core.value());
  };
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.request_id = "d" + std::to_string(i);
    r.prompt_ids = {1, 2, 3, 4, 1, 2, 3};
    r.prompt_ids.push_back(i % 5);
    r.stopping.ignore_eos = true;
    if (i % 2 == 0) {  // greedy, speculating, short
      r.sampling.temperature = 0.0f;
      r.stopping.max_tokens = 10 + i;
    } else {  // seeded sampling on the device, opted out, long: overlaps at the end
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 50 + i;
      r.speculative_decoding = false;
      r.stopping.max_tokens = 60;
    }
    reqs.push_back(std::move(r));
  }
  auto plain_core = make("none");
  const RunResult plain = Run(*plain_core, reqs);
  auto spec_core = make("ngram");
  const RunResult spec = Run(*spec_core, reqs);
  CHECK(spec.accepted > 0);
  CHECK(spec_core->num_overlapped_steps() > 0);
  for (const auto& [id, sink] : plain.sinks) {
    INFO(id);
    CHECK(spec.sinks.at(id)->tokens == sink->tokens);
  }
}

// Structured outputs with drafts: each draft position is masked by the grammar's state after the
// drafts before it (the real tiny model, which has a tokenizer). Greedy output is the output
// without speculation; sampled output still matches the constraint.
TEST_CASE("constrained requests speculate under the grammar's mask", "[speculative][engine]") {
  auto make = [](const std::string& method) {
    EngineConfig cfg;
    cfg.model.model_dir = LLM_TINY_MODEL_DIR;
    cfg.model.num_kv_blocks = 256;
    cfg.scheduler.max_num_seqs = 8;
    cfg.speculative.method = method;
    cfg.speculative.num_speculative_tokens = 4;
    auto core = EngineCore::Create(cfg);
    REQUIRE(core.ok());
    REQUIRE(core.value()->grammar_cache() != nullptr);
    return std::move(core.value());
  };
  auto plain_core = make("none");
  std::vector<GenerationRequest> reqs;
  const std::vector<std::string> regexes = {"(abc ){6}[a-z]{1,3}", "(ab|cd){10}",
                                            "[0-9]{2}(, [0-9]{2}){5}"};
  for (size_t i = 0; i < regexes.size() * 2; ++i) {
    GenerationRequest r;
    r.request_id = "g" + std::to_string(i);
    r.prompt_ids = plain_core->tokenizer()->Encode("abc abc abc ab ab cd 12, 12, 12", true);
    r.constraint.kind = Constraint::Kind::kRegex;
    r.constraint.text = regexes[i % regexes.size()];
    r.stopping.max_tokens = 64;
    if (i >= regexes.size()) {  // sampled
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 40 + i;
    } else {
      r.sampling.temperature = 0.0f;
    }
    if (i == 1) r.sampling.logprobs = 1;
    reqs.push_back(std::move(r));
  }
  const RunResult plain = Run(*plain_core, reqs);
  auto spec_core = make("ngram");
  const RunResult spec = Run(*spec_core, reqs);
  CHECK(spec.accepted > 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string& id = reqs[i].request_id;
    INFO(id);
    const Sink& s = *spec.sinks.at(id);
    CHECK(s.reason == FinishReason::kStop);  // the grammar completed
    const std::string text = spec_core->tokenizer()->Decode(s.tokens, true);
    CHECK(std::regex_match(text, std::regex(reqs[i].constraint.text)));
    if (reqs[i].sampling.temperature == 0.0f) {
      CHECK(s.tokens == plain.sinks.at(id)->tokens);
      REQUIRE(s.logprobs.size() == plain.sinks.at(id)->logprobs.size());
      for (size_t t = 0; t < s.logprobs.size(); ++t) {
        CHECK(s.logprobs[t] == Approx(plain.sinks.at(id)->logprobs[t]).margin(1e-4));
      }
    }
  }
}

// A randomized greedy workload on the synthetic model (a vocabulary of 6, so drafts are proposed
// and accepted often) under a small KV pool (preemption), chunked prompts, the prefix cache,
// stop tokens, min_tokens, penalties, logprobs and aborts: every request streams exactly the
// tokens of the run without speculation (an aborted one a prefix of them), and every block
// comes back.
TEST_CASE("randomized greedy workload: speculation changes no token and leaks no block",
          "[speculative][engine]") {
  auto make = [](const std::string& method) {
    EngineConfig cfg;
    cfg.model.model_dir = "synthetic:vocab=6,max_len=512,device_sampling=1";
    cfg.model.block_size = 4;
    cfg.model.num_kv_blocks = 40;
    cfg.scheduler.max_num_seqs = 10;
    cfg.scheduler.max_batched_tokens = 24;
    cfg.require_tokenizer = false;
    cfg.speculative.method = method;
    cfg.speculative.num_speculative_tokens = 3;
    auto core = EngineCore::Create(cfg);
    REQUIRE(core.ok());
    return std::move(core.value());
  };
  for (uint32_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 30; ++i) {
      GenerationRequest r;
      r.request_id = "w" + std::to_string(i);
      const int len = 1 + static_cast<int>(rng() % 30);
      for (int t = 0; t < len; ++t) r.prompt_ids.push_back(static_cast<int32_t>(rng() % 6));
      r.sampling.temperature = 0.0f;
      r.stopping.max_tokens = 1 + static_cast<int>(rng() % 40);
      r.stopping.min_tokens = static_cast<int>(rng() % 4) % (r.stopping.max_tokens + 1);
      r.stopping.ignore_eos = rng() % 2;
      if (rng() % 3 == 0) r.stopping.stop_token_ids.push_back(static_cast<int32_t>(rng() % 6));
      if (rng() % 4 == 0) r.sampling.repetition_penalty = 1.2f;
      if (rng() % 4 == 0) r.sampling.logprobs = 1;
      r.priority = static_cast<int>(rng() % 3);
      reqs.push_back(std::move(r));
    }
    std::map<int, std::string> abort_at;
    for (int i = 0; i < 5; ++i)
      abort_at[static_cast<int>(rng() % 80)] = "w" + std::to_string(rng() % 30);
    auto plain_core = make("none");
    const RunResult plain = Run(*plain_core, reqs);
    auto spec_core = make("ngram");
    const RunResult spec = Run(*spec_core, reqs, abort_at);
    CHECK(spec.accepted > 20);
    CHECK(spec_core->metrics()->preemptions.value() > 0);
    int stopped = 0;
    for (const auto& [id, want] : plain.sinks) {
      INFO(id);
      const Sink& got = *spec.sinks.at(id);
      if (got.reason == FinishReason::kAborted) {
        REQUIRE(got.tokens.size() <= want->tokens.size());
        CHECK(std::equal(got.tokens.begin(), got.tokens.end(), want->tokens.begin()));
        continue;
      }
      CHECK(got.tokens == want->tokens);
      CHECK(got.reason == want->reason);
      stopped += got.reason == FinishReason::kStop;
    }
    CHECK(stopped > 0);
  }
}

TEST_CASE("aborted and preempted speculating requests return every block",
          "[speculative][engine]") {
  test::TempDir dir("spec_abort");
  test::TinyLlama("llama").Write(dir.path());
  std::vector<GenerationRequest> reqs = GreedyWorkload(99);
  for (GenerationRequest& r : reqs) r.stopping.max_tokens = 40;
  // 20 blocks of 4 slots for 6 sequences growing to ~60 tokens: preemption is certain.
  auto core = MakeCore(dir.path().string(), "ngram", 3, 20);
  const RunResult res = Run(*core, reqs, {{3, "r0"}, {9, "r2"}, {15, "r5"}});
  CHECK(res.accepted > 0);
  CHECK(res.sinks.at("r0")->reason == FinishReason::kAborted);
  CHECK(core->metrics()->preemptions.value() > 0);
  // The metrics count what the steps reported.
  const EngineMetrics& m = *core->metrics();
  CHECK(m.spec_drafts.value() == res.drafts);
  CHECK(m.spec_draft_tokens.value() == res.draft_tokens);
  CHECK(m.spec_accepted_tokens.value() == res.accepted);
  const std::string text = m.Render();
  for (const char* name :
       {"llm_spec_decode_num_drafts_total", "llm_spec_decode_num_draft_tokens_total",
        "llm_spec_decode_num_accepted_tokens_total", "llm_spec_decode_acceptance_rate",
        "llm_spec_decode_mean_accepted_tokens", "llm_engine_step_draft_seconds_count",
        "llm_engine_step_verify_seconds_count"}) {
    CHECK(text.find(name) != std::string::npos);
  }
  const double rate = static_cast<double>(res.accepted) / res.draft_tokens;
  CHECK(text.find("llm_spec_decode_acceptance_rate " + [&] {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", rate);
    return std::string(buf);
  }()) != std::string::npos);
}

// Sampled requests end to end: the distribution of the second generated token (over many seeds)
// with speculation is the one without. The logit bias pulls the tokens towards the prompt's, so
// the n-gram proposer drafts the second token most of the time.
TEST_CASE("sampled decoding with n-gram drafts keeps the token distribution",
          "[speculative][engine]") {
  test::TempDir dir("spec_sampled");
  test::TinyLlama("llama", 4).Write(dir.path());
  const std::vector<int32_t> prompt = {2, 10, 11, 12, 2, 10, 11, 12};
  auto histogram = [&](const std::string& method, uint64_t seed0, int* accepted) {
    auto core = MakeCore(dir.path().string(), method, 2, 400);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 1500; ++i) {
      GenerationRequest r;
      r.request_id = "s" + std::to_string(i);
      r.prompt_ids = prompt;
      r.sampling.top_k = 8;
      r.sampling.seed = seed0 + static_cast<uint64_t>(i);
      r.sampling.temperature = 1.5f;
      r.sampling.logit_bias = {{2, 12.0f}, {10, 12.0f}, {11, 12.0f}, {12, 12.0f}};
      r.stopping.max_tokens = 3;  // room for one draft after the first token
      r.stopping.ignore_eos = true;
      reqs.push_back(std::move(r));
    }
    const RunResult res = Run(*core, reqs);
    *accepted = res.accepted;
    std::map<int32_t, int> second;
    for (const auto& [id, sink] : res.sinks) {
      REQUIRE(sink->tokens.size() == 3);
      second[sink->tokens[1]]++;
    }
    return second;
  };
  int accepted_plain = 0, accepted_spec = 0;
  const std::map<int32_t, int> plain = histogram("none", 1, &accepted_plain);
  const std::map<int32_t, int> spec = histogram("ngram", 100000, &accepted_spec);
  CHECK(accepted_spec > 100);
  // Chi-square test of homogeneity over the tokens seen at least 10 times in all, the rest pooled.
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
  INFO("chi2 " << chi2 << " over " << df << " degrees of freedom");
  REQUIRE(df >= 2);
  // The p = 0.001 critical value, by the Wilson-Hilferty approximation.
  const double z = 3.090;
  const double h = 2.0 / (9.0 * df);
  const double critical = df * std::pow(1 - h + z * std::sqrt(h), 3);
  CHECK(chi2 < critical);
}

}  // namespace
}  // namespace llm
