// Adaptive draft length (--speculative-adaptive-k): the per-request rule, and the engine with it:
// exact greedy tokens, and fewer drafts where drafts are rejected.
#include <catch2/catch.hpp>

#include "engine/speculative/adaptive_draft_length.h"
#include "speculative_harness.h"

namespace llm {
namespace {

using namespace spec_test;

TEST_CASE("adaptive draft length follows the request's acceptance", "[speculative][adaptive]") {
  AdaptiveDraftLength d(4);
  CHECK(d.Next() == 4);  // optimistic start
  // Every first draft rejected: down to one draft per step, never zero.
  for (int i = 0; i < 30; ++i) d.Observe(d.Next(), 0);
  CHECK(d.Next() == 1);
  CHECK(d.acceptance() < 0.01);
  // Then every draft accepted: back to the full length.
  for (int i = 0; i < 30; ++i) d.Observe(d.Next(), d.Next());
  CHECK(d.Next() == 4);
  CHECK(d.acceptance() > 0.99);
  // About 0.7 per draft (7 accepted of 10 tried): 0.7^3 = 0.34 >= 0.3 > 0.7^4, three drafts.
  AdaptiveDraftLength m(4);
  for (int i = 0; i < 60; ++i) m.Observe(4, i % 3 == 2 ? 1 : 3);  // 7 accepted per 10 tried
  CHECK(m.acceptance() == Approx(0.7).margin(0.03));
  CHECK(m.Next() == 3);
  // About 0.5: 0.5^2 = 0.25 < 0.3, one draft.
  AdaptiveDraftLength h(4);
  for (int i = 0; i < 60; ++i) h.Observe(2, 1);
  CHECK(h.acceptance() == Approx(0.5).margin(0.01));
  CHECK(h.Next() == 1);
  // K = 1 stays 1.
  AdaptiveDraftLength one(1);
  one.Observe(1, 1);
  CHECK(one.Next() == 1);
}

TEST_CASE("adaptive draft length keeps greedy tokens and drafts less where drafts fail",
          "[speculative][adaptive][engine]") {
  for (const Family& f : {Families()[0], Families()[6]}) {  // llama, deepseek_v2 (MLA)
    INFO(f.name);
    test::TempDir dir("spec_adaptive");
    f.make().Write(dir.path());
    const std::vector<GenerationRequest> reqs = GreedyWorkload(41);
    auto plain_core = MakeCore(dir.path().string(), "none", 4);
    const RunResult plain = Run(*plain_core, reqs);
    auto fixed_core = MakeCore(dir.path().string(), "ngram", 4);
    const RunResult fixed = Run(*fixed_core, reqs);
    auto adaptive_core = MakeCore(dir.path().string(), "ngram", 4, 96, 0, "", true);
    const RunResult adaptive = Run(*adaptive_core, reqs);
    for (const auto& [id, sink] : plain.sinks) {
      INFO(id);
      CHECK(adaptive.sinks.at(id)->tokens == sink->tokens);
    }
    CHECK(adaptive.accepted > 0);
    REQUIRE(fixed.accepted < fixed.draft_tokens);  // the workload rejects drafts
    CHECK(adaptive.draft_tokens < fixed.draft_tokens);
    // The rejected share falls: fewer drafts verified per accepted one.
    CHECK(static_cast<double>(adaptive.accepted) / adaptive.draft_tokens >
          static_cast<double>(fixed.accepted) / fixed.draft_tokens);
  }
  // A draft model that is the target: every draft accepted, so the length stays K.
  test::TempDir dir("spec_adaptive_draft");
  test::TinyLlama("llama").Write(dir.path());
  const std::vector<GenerationRequest> reqs = GreedyWorkload(43);
  auto fixed_core = MakeCore(dir.path().string(), "draft", 3, 96, 0, dir.path().string());
  const RunResult fixed = Run(*fixed_core, reqs);
  auto adaptive_core = MakeCore(dir.path().string(), "draft", 3, 96, 0, dir.path().string(), true);
  const RunResult adaptive = Run(*adaptive_core, reqs);
  CHECK(fixed.accepted == fixed.draft_tokens);
  CHECK(adaptive.draft_tokens == fixed.draft_tokens);
  CHECK(adaptive.accepted == adaptive.draft_tokens);
}

}  // namespace
}  // namespace llm
