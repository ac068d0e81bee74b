// MTP speculation (--speculative-method mtp) through EngineCore on a tiny DeepSeek-V3 checkpoint
// with its multi-token-prediction layer (CPU): greedy output is exactly the output without
// speculation, through prompt chunks, paused speculation, opted-out requests, preemption, aborts
// and prefix-cache hits, and constrained requests; its proposals do not depend on preemption,
// chunking or prefix hits; sampled requests keep their distribution; an MTP layer built to predict
// what the target will predict next has (almost) every draft accepted, which holds only if it
// reads the right token and position; checkpoints without an MTP layer are refused by name.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "speculative_harness.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

using namespace spec_test;

constexpr int kHidden = 32, kVocab = 64, kExperts = 8, kMoeInter = 8;

// The MoE block of DeepSeek layer `p` (a "model.layers.N." prefix) as TinyDeepseekV3 writes it.
void AddMoe(test::TinyCheckpoint* c, const std::string& p, uint32_t* s) {
  c->AddF32(p + "mlp.gate.weight", {kExperts, kHidden}, 0, 1.0f, ++*s);
  c->AddF32(p + "mlp.gate.e_score_correction_bias", {kExperts}, 0, 0.1f, ++*s);
  auto mlp = [&](const std::string& x) {
    c->AddF32(x + "gate_proj.weight", {kMoeInter, kHidden}, 0, 0.3f, ++*s);
    c->AddF32(x + "up_proj.weight", {kMoeInter, kHidden}, 0, 0.3f, ++*s);
    c->AddF32(x + "down_proj.weight", {kHidden, kMoeInter}, 0, 0.3f, ++*s);
  };
  for (int e = 0; e < kExperts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".");
  mlp(p + "mlp.shared_experts.");
}

// TinyDeepseekV3 (two layers) with one MTP layer, model.layers.2: enorm, hnorm, eh_proj, an MLA
// + MoE decoder layer, shared_head.norm; its own embed_tokens and shared_head.head when `own`.
test::TinyCheckpoint TinyDeepseekV3Mtp(bool own_embedding_and_head, uint32_t seed = 5) {
  test::TinyCheckpoint c = TinyDeepseekV3();
  c.config["num_nextn_predict_layers"] = 1;
  const std::string p = "model.layers.2.";
  const std::string a = p + "self_attn.";
  uint32_t s = seed * 1000 + 500;
  c.AddF32(p + "enorm.weight", {kHidden}, 1, 0.1f, ++s);
  c.AddF32(p + "hnorm.weight", {kHidden}, 1, 0.1f, ++s);
  c.AddF32(p + "eh_proj.weight", {kHidden, 2 * kHidden}, 0, 0.3f, ++s);
  c.AddLayerNorms(p, kHidden, &s);
  c.AddF32(a + "q_proj.weight", {2 * 16, kHidden}, 0, 0.3f, ++s);
  c.AddF32(a + "kv_a_proj_with_mqa.weight", {16 + 8, kHidden}, 0, 0.3f, ++s);
  c.AddF32(a + "kv_a_layernorm.weight", {16}, 1, 0.1f, ++s);
  c.AddF32(a + "kv_b_proj.weight", {2 * 16, 16}, 0, 0.3f, ++s);
  c.AddF32(a + "o_proj.weight", {kHidden, 2 * 8}, 0, 0.3f, ++s);
  AddMoe(&c, p, &s);
  c.AddF32(p + "shared_head.norm.weight", {kHidden}, 1, 0.1f, ++s);
  if (own_embedding_and_head) {
    c.AddF32(p + "embed_tokens.weight", {kVocab, kHidden}, 0, 1.0f, ++s);
    c.AddF32(p + "shared_head.head.weight", {kVocab, kHidden}, 0, 1.0f, ++s);
  }
  return c;
}

void SetF32(test::TinyCheckpoint* c, const std::string& name, const std::vector<float>& v) {
  TensorToWrite* t = c->Find(name);
  REQUIRE(t != nullptr);
  REQUIRE(t->data.size() == v.size() * 4);
  std::memcpy(t->data.data(), v.data(), t->data.size());
}

void Zero(test::TinyCheckpoint* c, const std::string& name) {
  SetF32(c, name, std::vector<float>(c->F32(name).size(), 0.0f));
}

void CheckSameTokens(const RunResult& plain, const RunResult& spec) {
  for (const auto& [id, sink] : plain.sinks) {
    INFO(id);
    const Sink& s = *spec.sinks.at(id);
    if (s.reason == FinishReason::kAborted || sink->reason == FinishReason::kAborted) continue;
    CHECK(s.tokens == sink->tokens);
    CHECK(s.reason == sink->reason);
    REQUIRE(s.logprobs.size() == sink->logprobs.size());
    for (size_t i = 0; i < s.logprobs.size(); ++i) {
      CHECK(s.logprobs[i] == Approx(sink->logprobs[i]).margin(1e-4));
    }
  }
}

TEST_CASE("greedy decoding with the MTP layer gives exactly the tokens without it",
          "[speculative][mtp][engine]") {
  for (bool own : {false, true}) {
    test::TempDir dir("spec_mtp_exact");
    TinyDeepseekV3Mtp(own).Write(dir.path());
    const std::string d = dir.path().string();
    for (int k : {1, 3}) {
      for (int pause : {0, 3}) {  // 3: speculation pauses while more requests run or wait
        INFO("own embedding and head " << own << ", K = " << k << ", pause above " << pause);
        const std::vector<GenerationRequest> reqs = GreedyWorkload(17 + k);
        auto plain_core = MakeCore(d, "none", k);
        const RunResult plain = Run(*plain_core, reqs);
        auto spec_core = MakeCore(d, "mtp", k, 96, pause);
        REQUIRE(spec_core->mtp_model() != nullptr);
        CHECK(spec_core->mtp_model()->config().num_layers == 1);
        const RunResult spec = Run(*spec_core, reqs);
        CHECK(spec.drafts > 0);
        CHECK(spec.draft_tokens <= spec.drafts * k);
        CheckSameTokens(plain, spec);
      }
    }
  }
}

// A small KV pool (preemption by recompute), aborts, and prompts sharing a prefix (prefix-cache
// hits, which give back their last matched block for the MTP layer): every block comes back and
// the tokens are those without speculation.
TEST_CASE("MTP speculation under preemption, aborts and prefix-cache hits",
          "[speculative][mtp][engine]") {
  test::TempDir dir("spec_mtp_preempt");
  TinyDeepseekV3Mtp(false).Write(dir.path());
  const std::string d = dir.path().string();
  std::vector<GenerationRequest> reqs = GreedyWorkload(99);
  for (GenerationRequest& r : reqs) r.stopping.max_tokens = 40;
  for (int i = 0; i < 3; ++i) {  // behind one 12-token prefix (three full blocks of 4)
    GenerationRequest r;
    r.request_id = "shared" + std::to_string(i);
    r.prompt_ids = {5, 9, 14, 5, 9, 14, 22, 5, 9, 14, 22, 30, static_cast<int32_t>(40 + i)};
    r.sampling.temperature = 0.0f;
    r.stopping.max_tokens = 24;
    r.stopping.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  auto plain_core = MakeCore(d, "none", 3, 20);
  const RunResult plain = Run(*plain_core, reqs, {{3, "r0"}, {9, "r2"}});
  auto core = MakeCore(d, "mtp", 3, 20);
  const RunResult res = Run(*core, reqs, {{3, "r0"}, {9, "r2"}});
  CHECK(res.drafts > 0);
  CHECK(res.sinks.at("r0")->reason == FinishReason::kAborted);
  CHECK(core->metrics()->preemptions.value() > 0);
  CHECK(core->metrics()->prefix_hits.value() > 0);
  CheckSameTokens(plain, res);
}

// The MTP layer's K/V through the step flow: its proposals are a function of the sequence's
// tokens alone, so a run with a small KV pool (preemption by recompute), small prompt chunks,
// prefix-cache hits and aborts must propose at every (request, position) it shares with a run
// without any of them exactly what that run proposed. A catch-up that skipped or repeated a
// position, K/V left from a preempted life, a prefix hit whose last block kept another
// sequence's MTP rows, or a row reading the wrong hidden state would change some proposals.
TEST_CASE("MTP proposals do not depend on preemption, chunking or prefix hits",
          "[speculative][mtp][engine]") {
  test::TempDir dir("spec_mtp_proposals");
  TinyDeepseekV3Mtp(true).Write(dir.path());
  const std::string d = dir.path().string();
  std::mt19937 rng(7);
  std::vector<GenerationRequest> reqs;
  const std::vector<int32_t> prefix = {5, 9, 14, 5, 9, 14, 22, 5, 9, 14, 22, 30};
  for (int i = 0; i < 16; ++i) {
    GenerationRequest r;
    r.request_id = "p" + std::to_string(i);
    if (i % 3 == 0) r.prompt_ids = prefix;  // prefix-cache hits
    const int len = 1 + static_cast<int>(rng() % 20);
    for (int t = 0; t < len; ++t) r.prompt_ids.push_back(2 + static_cast<int32_t>(rng() % 60));
    r.sampling.temperature = 0.0f;
    r.stopping.max_tokens = 8 + static_cast<int>(rng() % 30);
    r.stopping.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  using Key = std::pair<std::string, int>;
  auto record = [](EngineCore& core, std::map<Key, std::vector<int32_t>>* out) {
    core.set_proposal_observer([out](const std::string& id, int pos, std::span<const int32_t> d) {
      (*out)[{id, pos}] = std::vector<int32_t>(d.begin(), d.end());
    });
  };
  EngineConfig cfg;
  cfg.model.model_dir = d;
  cfg.model.block_size = 4;
  cfg.model.num_kv_blocks = 400;
  cfg.scheduler.max_num_seqs = 16;
  cfg.scheduler.max_batched_tokens = 2048;
  cfg.scheduler.enable_prefix_caching = false;
  cfg.require_tokenizer = false;
  cfg.speculative.method = "mtp";
  cfg.speculative.num_speculative_tokens = 3;
  cfg.speculative.disable_by_batch_size = 0;
  auto roomy = EngineCore::Create(cfg);
  REQUIRE(roomy.ok());
  std::map<Key, std::vector<int32_t>> want, got;
  record(**roomy, &want);
  Run(**roomy, reqs);
  cfg.model.num_kv_blocks = 24;
  cfg.scheduler.max_num_seqs = 6;
  cfg.scheduler.max_batched_tokens = 10;
  cfg.scheduler.enable_prefix_caching = true;
  auto tight = EngineCore::Create(cfg);
  REQUIRE(tight.ok());
  record(**tight, &got);
  Run(**tight, reqs, {{15, "p4"}, {30, "p7"}});
  CHECK((*tight)->metrics()->preemptions.value() > 0);
  CHECK((*tight)->metrics()->prefix_hits.value() > 0);
  int shared = 0;
  for (const auto& [key, drafts] : got) {
    auto it = want.find(key);
    if (it == want.end()) continue;
    INFO(key.first << " at position " << key.second);
    const size_t n = std::min(drafts.size(), it->second.size());
    CHECK(std::equal(drafts.begin(), drafts.begin() + n, it->second.begin()));
    ++shared;
  }
  INFO(shared << " shared proposals of " << got.size());
  CHECK(shared > 50);
}

// An MTP layer that predicts what the target predicts next: the target's layers add nothing
// (o_proj and every down projection zero), so its next token is a function of the current one
// through the final norm and LM head; the MTP layer's eh_proj passes enorm(embedding) through
// ([I 0]), its own block adds nothing, and shared_head.norm is the model's norm over the shared
// LM head. Its row at position i then predicts from t_{i+1} what the target predicts at i + 1,
// so drafts are accepted, chained ones too, only when the row reads the token after its
// position. The acceptance metrics count them.
TEST_CASE("an MTP layer that copies the target has its drafts accepted",
          "[speculative][mtp][engine]") {
  test::TinyCheckpoint c = TinyDeepseekV3Mtp(false);
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Zero(&c, p + "self_attn.o_proj.weight");
    if (l == 0) {
      Zero(&c, p + "mlp.down_proj.weight");
      continue;
    }
    for (int e = 0; e < kExperts; ++e) {
      Zero(&c, p + "mlp.experts." + std::to_string(e) + ".down_proj.weight");
    }
    Zero(&c, p + "mlp.shared_experts.down_proj.weight");
  }
  std::vector<float> eh(static_cast<size_t>(kHidden) * 2 * kHidden, 0.0f);
  for (int i = 0; i < kHidden; ++i) eh[static_cast<size_t>(i) * 2 * kHidden + i] = 1.0f;
  SetF32(&c, "model.layers.2.eh_proj.weight", eh);
  SetF32(&c, "model.layers.2.enorm.weight", std::vector<float>(kHidden, 1.0f));
  SetF32(&c, "model.layers.2.shared_head.norm.weight", c.F32("model.norm.weight"));
  test::TempDir dir("spec_mtp_copy");
  c.Write(dir.path());
  const std::string d = dir.path().string();
  for (int k : {1, 4}) {
    INFO("K = " << k);
    const std::vector<GenerationRequest> reqs = GreedyWorkload(23 + k);
    auto plain_core = MakeCore(d, "none", k);
    const RunResult plain = Run(*plain_core, reqs);
    auto core = MakeCore(d, "mtp", k);
    const RunResult res = Run(*core, reqs);
    INFO("accepted " << res.accepted << " of " << res.draft_tokens);
    CHECK(res.drafts > 10);
    CHECK(res.accepted >= 0.9 * res.draft_tokens);
    CHECK(core->metrics()->spec_accepted_tokens.value() == res.accepted);
    CHECK(core->metrics()->spec_draft_tokens.value() == res.draft_tokens);
    CheckSameTokens(plain, res);
  }
}

// Sampled requests end to end: the distribution of the second generated token (over many seeds)
// with MTP drafts is the one without speculation. The MTP layer's q differs from the target's p
// (random weights, both pulled towards the same four tokens by the logit bias), so drafts are
// accepted and rejected.
TEST_CASE("sampled decoding with the MTP layer keeps the token distribution",
          "[speculative][mtp][engine]") {
  test::TempDir dir("spec_mtp_sampled");
  TinyDeepseekV3Mtp(true).Write(dir.path());
  const std::string d = dir.path().string();
  const std::vector<int32_t> prompt = {2, 10, 11, 12, 2, 10, 11, 12};
  auto histogram = [&](const std::string& method, uint64_t seed0, RunResult* out) {
    auto core = MakeCore(d, method, 2, 400);
    *out = Run(*core, SampledWorkload(prompt, 8.0f, seed0));
    return SecondTokens(*out);
  };
  RunResult plain_run, spec_run;
  const std::map<int32_t, int> plain = histogram("none", 1, &plain_run);
  const std::map<int32_t, int> spec = histogram("mtp", 100000, &spec_run);
  CHECK(spec_run.accepted > 100);
  CHECK(spec_run.accepted < spec_run.draft_tokens - 100);  // rejections too
  CheckSameDistribution(plain, spec,
                        "accepted " + std::to_string(spec_run.accepted) + " of " +
                            std::to_string(spec_run.draft_tokens));
}

// Constrained requests (a tokenizer and a grammar): each MTP draft row is masked with the
// grammar's state after the drafts before it, as the verification masks the target's rows. The
// checkpoint takes the embedded tiny model's tokenizer (770 ids); greedy output is the output
// without speculation and sampled output matches its constraint.
TEST_CASE("MTP drafts under the grammar's mask", "[speculative][mtp][engine]") {
  namespace fs = std::filesystem;
  constexpr int kTokVocab = 770;
  test::TinyCheckpoint c = TinyDeepseekV3Mtp(false);
  c.config["vocab_size"] = kTokVocab;
  c.config["bos_token_id"] = 768;
  c.config["eos_token_id"] = 769;
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    c.Remove(name);
    c.AddF32(name, {kTokVocab, kHidden}, 0, 1.0f, 77);
  }
  test::TempDir dir("spec_mtp_grammar");
  c.Write(dir.path());
  fs::copy_file(fs::path(LLM_TINY_MODEL_DIR) / "tokenizer.json", dir.path() / "tokenizer.json");
  auto make = [&](const std::string& method) {
    EngineConfig cfg;
    cfg.model.model_dir = dir.path().string();
    cfg.model.block_size = 4;
    cfg.model.num_kv_blocks = 256;
    cfg.scheduler.max_num_seqs = 8;
    cfg.speculative.method = method;
    cfg.speculative.num_speculative_tokens = 3;
    auto core = EngineCore::Create(cfg);
    INFO(core.status().ToString());
    REQUIRE(core.ok());
    REQUIRE(core.value()->grammar_cache() != nullptr);
    return std::move(core.value());
  };
  auto plain_core = make("none");
  std::vector<GenerationRequest> greedy, sampled;
  const std::vector<std::string> regexes = {"(abc ){6}[a-z]{1,3}", "(ab|cd){10}",
                                            "[0-9]{2}(, [0-9]{2}){5}"};
  for (size_t i = 0; i < regexes.size() * 2; ++i) {
    GenerationRequest r;
    r.request_id = "g" + std::to_string(i);
    r.prompt_ids = plain_core->tokenizer()->Encode("abc abc abc ab ab cd 12, 12, 12", true);
    r.constraint.kind = Constraint::Kind::kRegex;
    r.constraint.text = regexes[i % regexes.size()];
    r.stopping.max_tokens = 64;
    r.sampling.temperature = i < regexes.size() ? 0.0f : 1.0f;
    r.sampling.seed = 40 + i;
    (i < regexes.size() ? greedy : sampled).push_back(std::move(r));
  }
  const RunResult plain = Run(*plain_core, greedy);
  auto spec_core = make("mtp");
  const RunResult spec = Run(*spec_core, greedy);
  CHECK(spec.drafts > 0);
  for (const GenerationRequest& r : greedy) {
    INFO(r.request_id);
    CHECK(spec.sinks.at(r.request_id)->tokens == plain.sinks.at(r.request_id)->tokens);
  }
  const RunResult spec_sampled = Run(*spec_core, sampled);
  for (const GenerationRequest& r : sampled) {
    INFO(r.request_id);
    const Sink& s = *spec_sampled.sinks.at(r.request_id);
    CHECK(s.reason == FinishReason::kStop);
    const std::string text = spec_core->tokenizer()->Decode(s.tokens, true);
    CHECK(std::regex_match(text, std::regex(r.constraint.text)));
  }
}

TEST_CASE("speculative method mtp is refused without an MTP layer", "[speculative][mtp]") {
  auto refusal = [](const test::TinyCheckpoint& c) {
    test::TempDir dir("spec_mtp_refused");
    c.Write(dir.path());
    EngineConfig cfg;
    cfg.model.model_dir = dir.path().string();
    cfg.model.block_size = 4;
    cfg.model.num_kv_blocks = 32;
    cfg.require_tokenizer = false;
    cfg.speculative.method = "mtp";
    auto core = EngineCore::Create(cfg);
    REQUIRE_FALSE(core.ok());
    return core.status().message();
  };
  CHECK_THAT(refusal(test::TinyLlama("llama")), Catch::Contains("needs a DeepSeek-V3 checkpoint") &&
                                                    Catch::Contains("not a DeepSeek"));
  CHECK_THAT(refusal(TinyDeepseekV3()), Catch::Contains("no multi-token-prediction layer") &&
                                            Catch::Contains("num_nextn_predict_layers is 0"));
  test::TinyCheckpoint no_weights = TinyDeepseekV3();
  no_weights.config["num_nextn_predict_layers"] = 1;
  CHECK_THAT(refusal(no_weights), Catch::Contains("model.layers.2.eh_proj.weight is missing"));
  test::TinyCheckpoint two = TinyDeepseekV3Mtp(false);
  two.config["num_nextn_predict_layers"] = 2;
  CHECK_THAT(refusal(two), Catch::Contains("num_nextn_predict_layers 2 > 1"));
  test::TinyCheckpoint partial = TinyDeepseekV3Mtp(false);
  partial.Remove("model.layers.2.hnorm.weight");
  CHECK_THAT(refusal(partial), Catch::Contains("model.layers.2.hnorm.weight"));
  test::TinyCheckpoint extra = TinyDeepseekV3Mtp(false);  // a tensor nobody reads
  extra.AddF32("model.layers.2.unknown.weight", {4}, 0, 1.0f, 1);
  CHECK_THAT(refusal(extra), Catch::Contains("model.layers.2.unknown.weight"));
}

// The MTP layer's KV lives in the target's blocks: a memory budget is split by both networks'
// bytes per block.
TEST_CASE("the KV budget counts the MTP layer's bytes per block", "[speculative][mtp]") {
  test::TempDir dir("spec_mtp_budget");
  TinyDeepseekV3Mtp(false).Write(dir.path());
  EngineConfig cfg;
  cfg.model.model_dir = dir.path().string();
  cfg.model.block_size = 4;
  cfg.model.kv_cache_bytes = 1 << 20;
  cfg.require_tokenizer = false;
  auto plain = EngineCore::Create(cfg);
  REQUIRE(plain.ok());
  cfg.speculative.method = "mtp";
  auto mtp = EngineCore::Create(cfg);
  REQUIRE(mtp.ok());
  const size_t target = (*plain)->model().kv_bytes_per_block();
  const size_t layer = (*mtp)->mtp_model()->kv_bytes_per_block();
  CHECK(layer * 2 == target);  // one latent layer beside two
  CHECK((*mtp)->mtp_model()->num_kv_blocks() == (*mtp)->model().num_kv_blocks());
  CHECK((*mtp)->model().num_kv_blocks() == static_cast<int>((1 << 20) / (target + layer)));
}

}  // namespace
}  // namespace llm
