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
#include "speculative_harness.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

using namespace spec_test;

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
// rows are drawn on the device beside the step's other rows, requests
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
    const RunResult res = Run(*core, SampledWorkload(prompt, 12.0f, seed0));
    *accepted = res.accepted;
    return SecondTokens(res);
  };
  int accepted_plain = 0, accepted_spec = 0;
  const std::map<int32_t, int> plain = histogram("none", 1, &accepted_plain);
  const std::map<int32_t, int> spec = histogram("ngram", 100000, &accepted_spec);
  CHECK(accepted_spec > 100);
  CheckSameDistribution(plain, spec, "n-gram drafts");
}

// On a model that samples on the device, a drafted sequence's rows are drawn there too (one-hot
// n-gram drafts, no logprobs, no grammar): no logit row comes back to the host, greedy output is
// the output without speculation (penalties counting the earlier drafts included), and sampled
// output keeps its distribution (each row its own draw, accepted while it equals the draft).
TEST_CASE("drafted rows drawn on the device keep greedy tokens and the sampled distribution",
          "[speculative][engine]") {
  test::TempDir dir("spec_device_rows");
  test::TinyLlama("llama", 4).Write(dir.path());
  DeviceCoreOptions o;
  o.num_blocks = 400;
  o.disable_by_batch_size = 0;  // SampledWorkload queues 1,500 requests
  auto make = [&](const std::string& method) {
    return MakeDeviceSamplingCore(dir.path().string(), method, o);
  };
  SECTION("greedy") {
    std::vector<GenerationRequest> reqs = GreedyWorkload(7);
    for (GenerationRequest& r : reqs) r.sampling.logprobs = 0;  // logprobs rows come back
    auto plain_core = make("none");
    const RunResult plain = Run(*plain_core, reqs);
    auto spec_core = make("ngram");
    const RunResult spec = Run(*spec_core, reqs);
    CHECK(spec.accepted > 0);
    CHECK(DeviceTarget(*spec_core).host_rows == 0);
    for (const auto& [id, sink] : plain.sinks) {
      INFO(id);
      CHECK(spec.sinks.at(id)->tokens == sink->tokens);
    }
  }
  SECTION("sampled") {
    const std::vector<int32_t> prompt = {2, 10, 11, 12, 2, 10, 11, 12};
    auto plain_core = make("none");
    const std::map<int32_t, int> plain =
        SecondTokens(Run(*plain_core, SampledWorkload(prompt, 12.0f, 1)));
    auto spec_core = make("ngram");
    const RunResult res = Run(*spec_core, SampledWorkload(prompt, 12.0f, 100000));
    CHECK(res.accepted > 100);
    CHECK(DeviceTarget(*spec_core).host_rows == 0);
    CheckSameDistribution(plain, SecondTokens(res), "n-gram drafts drawn on the device");
  }
}

}  // namespace
}  // namespace llm
