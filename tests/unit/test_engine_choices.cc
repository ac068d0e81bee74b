// n > 1 choices (GenerationRequest::n): one request fans out into n child requests that meet in
// one sink. Driven through the synthetic model (device sampling, prefix caching): each choice
// draws the tokens an n = 1 request with seed + index draws; choices 1..n-1 start after choice 0's
// prefill and reuse its full prompt blocks; every output carries its index; usage counts the
// prompt once and every choice's tokens; an abort ends every choice once and returns every block.
// Also logit_bias on a device-sampling model (its rows are sampled on the host).
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"

namespace llm {
namespace {

struct ChoicesSink : ResultSink {
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, FinishReason> reasons;
  int finals = 0;
  int outputs_after_final = 0;
  int errors = 0;
  Usage usage;
  void OnOutput(GenerationOutput o) override {
    if (finals > 0 || errors > 0) ++outputs_after_final;
    tokens[o.index].insert(tokens[o.index].end(), o.token_ids.begin(), o.token_ids.end());
    if (o.finish_reason != FinishReason::kNone) {
      CHECK(reasons.count(o.index) == 0);  // one final output per choice
      reasons[o.index] = o.finish_reason;
    }
    if (!o.error.ok()) ++errors;
    if (o.finished) {
      ++finals;
      usage = o.usage;
    }
  }
};

std::unique_ptr<EngineCore> MakeCore(bool prefix_caching = true) {
  EngineConfig cfg;
  cfg.model.model_dir = "synthetic:vocab=40,max_len=512,device_sampling=1";
  cfg.model.block_size = 8;
  cfg.model.num_kv_blocks = 64;
  cfg.scheduler.max_num_seqs = 8;
  cfg.scheduler.max_batched_tokens = 256;
  cfg.scheduler.enable_prefix_caching = prefix_caching;
  cfg.require_tokenizer = false;
  auto core = EngineCore::Create(cfg);
  REQUIRE(core.ok());
  return std::move(core.value());
}

GenerationRequest Request(const std::string& id, int n, uint64_t seed) {
  GenerationRequest r;
  r.request_id = id;
  for (int t = 0; t < 41; ++t) r.prompt_ids.push_back((t * 7 + 3) % 40);  // 5 full blocks + 1
  r.n = n;
  r.sampling.temperature = 8.0f;  // the synthetic model's hot logit is 10: a flat distribution
  r.sampling.seed = seed;
  r.stopping.max_tokens = 12;
  r.stopping.ignore_eos = true;
  return r;
}

// Runs to the end; returns the step records.
std::vector<StepRecord> Drain(EngineCore* core) {
  std::vector<StepRecord> steps;
  for (int i = 0; core->HasWork() && i < 10000; ++i) steps.push_back(core->Step());
  CHECK_FALSE(core->HasWork());
  return steps;
}

TEST_CASE("n choices: seeds seed + i, shared prompt blocks, indexed outputs, summed usage",
          "[engine][choices]") {
  auto core = MakeCore();
  const int baseline = core->num_free_blocks();
  constexpr int kN = 3;
  GenerationRequest r = Request("req", kN, 100);
  REQUIRE(core->Validate(&r).ok());
  auto sink = std::make_shared<ChoicesSink>();
  core->Add(r, sink);
  const std::vector<StepRecord> steps = Drain(core.get());

  REQUIRE(sink->finals == 1);
  CHECK(sink->outputs_after_final == 0);
  CHECK(sink->errors == 0);
  REQUIRE(sink->reasons.size() == kN);
  for (int i = 0; i < kN; ++i) {
    CHECK(sink->reasons[i] == FinishReason::kLength);
    CHECK(sink->tokens[i].size() == 12);
  }
  CHECK(sink->usage.prompt_tokens == 41);
  CHECK(sink->usage.completion_tokens == 12 * kN);

  // Choice i draws what an n = 1 request seeded 100 + i draws.
  for (int i = 0; i < kN; ++i) {
    auto solo = MakeCore();
    GenerationRequest one = Request("solo", 1, 100 + i);
    REQUIRE(solo->Validate(&one).ok());
    auto s = std::make_shared<ChoicesSink>();
    solo->Add(one, s);
    Drain(solo.get());
    CHECK(s->tokens[0] == sink->tokens[i]);
  }
  // Different seeds: the choices differ (40-token vocabulary, 12 tokens each).
  CHECK(sink->tokens[0] != sink->tokens[1]);

  // Choice 0 computes the prompt; the others start after its prefill and recompute at most the
  // last, partial block (41 = 5 * 8 + 1 tokens: 1 token).
  std::map<std::string, int> prefill_tokens;
  int first_sibling_step = -1, leader_done_step = -1;
  for (size_t s = 0; s < steps.size(); ++s) {
    for (const StepRecord::Entry& e : steps[s].entries) {
      if (e.is_prefill) prefill_tokens[e.request_id] += e.num_tokens;
      if (e.request_id == "req#0" && e.prefill_done && leader_done_step < 0) {
        leader_done_step = static_cast<int>(s);
      }
      if (e.request_id != "req#0" && first_sibling_step < 0) {
        first_sibling_step = static_cast<int>(s);
      }
    }
  }
  CHECK(prefill_tokens["req#0"] == 41);
  CHECK(prefill_tokens["req#1"] == 1);
  CHECK(prefill_tokens["req#2"] == 1);
  CHECK(first_sibling_step > leader_done_step);
  CHECK(core->num_free_blocks() == baseline);
}

TEST_CASE("n choices without a prefix cache start together", "[engine][choices]") {
  auto core = MakeCore(/*prefix_caching=*/false);
  const int baseline = core->num_free_blocks();
  GenerationRequest r = Request("np", 2, 3);
  REQUIRE(core->Validate(&r).ok());
  auto sink = std::make_shared<ChoicesSink>();
  core->Add(r, sink);
  const StepRecord first = core->Step();
  REQUIRE(first.entries.size() == 2);  // nothing to share: both compute the prompt at once
  for (const StepRecord::Entry& e : first.entries) CHECK(e.num_tokens == 41);
  Drain(core.get());
  CHECK(sink->finals == 1);
  CHECK(sink->usage.completion_tokens == 24);
  CHECK(core->num_free_blocks() == baseline);
}

TEST_CASE("n choices: greedy choices are identical, an abort ends every choice once",
          "[engine][choices]") {
  auto core = MakeCore();
  const int baseline = core->num_free_blocks();
  GenerationRequest g = Request("greedy", 2, 5);
  g.sampling.temperature = 0.0f;
  REQUIRE(core->Validate(&g).ok());
  auto gs = std::make_shared<ChoicesSink>();
  core->Add(g, gs);
  GenerationRequest a = Request("aborted", 4, 9);
  a.stopping.max_tokens = 200;
  REQUIRE(core->Validate(&a).ok());
  auto as = std::make_shared<ChoicesSink>();
  core->Add(a, as);
  for (int i = 0; i < 4; ++i) core->Step();  // choice 0's prefill, then the others start
  CHECK(core->Abort("aborted", Status::Ok()));
  CHECK_FALSE(core->Abort("aborted", Status::Ok()));  // gone
  Drain(core.get());
  CHECK(gs->tokens[0] == gs->tokens[1]);
  CHECK(gs->finals == 1);
  REQUIRE(as->finals == 1);
  CHECK(as->outputs_after_final == 0);
  REQUIRE(as->reasons.size() == 4);
  for (const auto& [index, reason] : as->reasons) CHECK(reason == FinishReason::kAborted);
  CHECK(core->num_free_blocks() == baseline);
}

TEST_CASE("n choices: a failing choice fails the request once and ends the others",
          "[engine][choices]") {
  auto core = MakeCore();
  const int baseline = core->num_free_blocks();
  GenerationRequest r = Request("dl", 3, 1);
  r.stopping.max_tokens = 200;
  REQUIRE(core->Validate(&r).ok());
  auto sink = std::make_shared<ChoicesSink>();
  core->Add(r, sink);
  core->Step();  // choice 0 prefilled; the others are admitted, still held before this step
  core->Step();
  core->ExpireDeadlines(std::chrono::steady_clock::now());  // no deadline: nothing happens
  CHECK(core->Abort("dl", Status(StatusCode::kDeadlineExceeded, "deadline exceeded")));
  Drain(core.get());
  CHECK(sink->errors == 1);
  CHECK(sink->outputs_after_final == 0);
  CHECK(core->num_free_blocks() == baseline);
  // A request id that would collide with a live choice's id is refused, not merged.
  GenerationRequest live = Request("x", 2, 1);
  REQUIRE(core->Validate(&live).ok());
  auto ls = std::make_shared<ChoicesSink>();
  core->Add(live, ls);
  GenerationRequest clash = Request("x#1", 1, 1);
  auto cs = std::make_shared<ChoicesSink>();
  core->Add(clash, cs);
  CHECK(cs->errors == 1);
  Drain(core.get());
  CHECK(ls->finals == 1);
  CHECK(core->num_free_blocks() == baseline);
}

TEST_CASE("logit_bias on a device-sampling model forces and bans tokens", "[engine][logit_bias]") {
  auto core = MakeCore();
  GenerationRequest r = Request("bias", 1, 77);
  r.sampling.logit_bias = {{13, 100.0f}};
  REQUIRE(core->Validate(&r).ok());
  auto sink = std::make_shared<ChoicesSink>();
  core->Add(r, sink);
  GenerationRequest b = Request("ban", 1, 78);
  b.sampling.temperature = 0.0f;
  for (int32_t t = 0; t < 40; ++t) {
    if (t != 21) b.sampling.logit_bias.emplace_back(t, -100.0f);
  }
  REQUIRE(core->Validate(&b).ok());
  auto bs = std::make_shared<ChoicesSink>();
  core->Add(b, bs);
  Drain(core.get());
  CHECK(sink->tokens[0] == std::vector<int32_t>(12, 13));
  CHECK(bs->tokens[0] == std::vector<int32_t>(12, 21));

  GenerationRequest bad = Request("bad", 1, 1);
  bad.sampling.logit_bias = {{40, 1.0f}};
  const Status s = core->Validate(&bad);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("logit_bias token id 40") != std::string::npos);
}

}  // namespace
}  // namespace llm
