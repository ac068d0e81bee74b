// N-gram speculation beside overlapped steps (issue 52): a step in which the proposer found no
// drafts overlaps as it would without speculation, and the step after it proposes late, from the
// context before the token still on the device (ProposeDrafts). Greedy tokens stay those of no
// speculation, on a prompt that never repeats (no drafts, every decode step overlapped) and on
// repetitive ones (drafts proposed behind a pending token, and accepted).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "speculative_harness.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

using namespace spec_test;

// One request run alone to its end, step by step.
struct Trace {
  std::vector<int32_t> tokens;
  int steps = 0, overlapped = 0, drafts = 0, accepted = 0;
  // Drafted steps right after an overlapped one: their drafts were proposed late.
  int late_drafts = 0, late_accepted = 0;
  int drafted_and_overlapped = 0;  // must stay 0: a step with drafts is synchronous

  // Sums another request's step counts into these (the tokens are per request: not summed).
  void AddCounts(const Trace& t) {
    steps += t.steps;
    overlapped += t.overlapped;
    drafts += t.drafts;
    accepted += t.accepted;
    late_drafts += t.late_drafts;
    late_accepted += t.late_accepted;
    drafted_and_overlapped += t.drafted_and_overlapped;
  }
};

Trace RunTraced(EngineCore& core, GenerationRequest r) {
  REQUIRE(core.Validate(&r).ok());
  auto sink = std::make_shared<Sink>();
  const int baseline = core.num_free_blocks();
  core.Add(std::move(r), sink);
  Trace t;
  bool prev_overlapped = false;
  for (; core.HasWork() && t.steps < 1000; ++t.steps) {
    const int64_t before = core.num_overlapped_steps();
    const StepRecord rec = core.Step();
    const bool overlapped = core.num_overlapped_steps() > before;
    t.overlapped += overlapped ? 1 : 0;
    t.drafts += rec.num_drafts;
    t.accepted += rec.num_accepted_tokens;
    if (prev_overlapped && rec.num_drafts > 0) {
      t.late_drafts += rec.num_drafts;
      t.late_accepted += rec.num_accepted_tokens;
    }
    if (overlapped && rec.num_drafts > 0) ++t.drafted_and_overlapped;
    prev_overlapped = overlapped;
  }
  REQUIRE(t.steps < 1000);
  CHECK(sink->finals == 1);
  CHECK(core.num_free_blocks() == baseline);
  t.tokens = sink->tokens;
  return t;
}

TEST_CASE("n-gram steps without drafts overlap as without speculation",
          "[speculative][engine][overlap]") {
  // The synthetic model over 32,000 tokens: its greedy token is a hash of (token, position), so
  // neither the prompt (all distinct) nor the output repeats a token and no suffix ever recurs.
  auto make = [](const std::string& method) {
    EngineConfig cfg = SpeculativeTestConfig("synthetic:vocab=32000,max_len=512,device_sampling=1",
                                             method, 3, 128, 32);
    auto core = EngineCore::Create(cfg);
    REQUIRE(core.ok());
    return std::move(core.value());
  };
  GenerationRequest r;
  r.request_id = "chat";
  for (int i = 0; i < 16; ++i) r.prompt_ids.push_back(100 + 37 * i);
  r.sampling.temperature = 0.0f;
  r.stopping.max_tokens = 40;
  r.stopping.ignore_eos = true;
  auto plain_core = make("none");
  const Trace plain = RunTraced(*plain_core, r);
  auto spec_core = make("ngram");
  const Trace spec = RunTraced(*spec_core, r);
  REQUIRE(plain.tokens.size() == 40);
  CHECK(spec.tokens == plain.tokens);
  CHECK(spec.drafts == 0);
  // Every step but the one that only collects the last token overlaps, as without speculation.
  CHECK(plain.overlapped == 40);
  CHECK(spec.overlapped == plain.overlapped);
  CHECK(spec.steps == plain.steps);
}

TEST_CASE("n-gram drafts proposed behind an overlapped step are verified exactly",
          "[speculative][engine][overlap]") {
  SECTION("tiny Llama, repetitive prompts") {
    // The target samples on the device and overlaps steps (DeviceSamplingModel); the requests
    // that are plain greedy (no logprobs, no penalties) may overlap.
    test::TempDir dir("spec_overlap");
    test::TinyLlama("llama", 4).Write(dir.path());
    auto plain_core = MakeDeviceSamplingCore(dir.path().string(), "none");
    auto spec_core = MakeDeviceSamplingCore(dir.path().string(), "ngram");
    Trace total;
    for (uint32_t seed : {3u, 7u, 11u}) {
      for (GenerationRequest r : GreedyWorkload(seed)) {
        r.sampling.logprobs = 0;
        r.sampling.repetition_penalty = 1.0f;
        r.speculative_decoding = true;
        INFO(seed << " " << r.request_id);
        const Trace plain = RunTraced(*plain_core, r);
        const Trace spec = RunTraced(*spec_core, r);
        CHECK(spec.tokens == plain.tokens);
        CHECK(spec.drafted_and_overlapped == 0);
        total.AddCounts(spec);
      }
    }
    CHECK(total.overlapped > 0);
    CHECK(total.drafts > 0);
    CHECK(total.accepted > 0);
    CHECK(total.late_drafts > 0);
    CHECK(total.late_accepted > 0);
    // Each drafted sequence-step feeds the pending token on the device into a synchronous step.
    CHECK(DeviceTarget(*spec_core).host_rows == 0);
  }
  SECTION("synthetic model over 5 tokens") {
    // Its outputs repeat by chance: drafts come both after synchronous and overlapped steps.
    auto make = [](const std::string& method) {
      EngineConfig cfg = SpeculativeTestConfig("synthetic:vocab=5,max_len=512,device_sampling=1",
                                               method, 4, 128, 32);
      auto core = EngineCore::Create(cfg);
      REQUIRE(core.ok());
      return std::move(core.value());
    };
    auto plain_core = make("none");
    auto spec_core = make("ngram");
    Trace total;
    for (int i = 0; i < 5; ++i) {
      GenerationRequest r;
      r.request_id = "s" + std::to_string(i);
      r.prompt_ids = {1, 2, 3, 4, 1, 2, 3, i};
      r.sampling.temperature = 0.0f;
      r.stopping.max_tokens = 30 + i;
      r.stopping.ignore_eos = true;
      INFO(r.request_id);
      const Trace plain = RunTraced(*plain_core, r);
      const Trace spec = RunTraced(*spec_core, r);
      CHECK(spec.tokens == plain.tokens);
      CHECK(spec.drafted_and_overlapped == 0);
      total.AddCounts(spec);
    }
    CHECK(total.overlapped > 0);
    CHECK(total.late_drafts > 0);
    CHECK(total.late_accepted > 0);
  }
}

}  // namespace
}  // namespace llm
