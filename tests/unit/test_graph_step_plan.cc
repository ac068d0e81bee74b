// The CUDA runner's graph choice (engine/runtime/graph_step_plan.h), on the host: which steps
// replay a graph of which (padded sequences, query rows), which run eagerly, and the padded batch
// of a step whose sequences have different row counts. The padding is checked for its meaning on
// the CPU runner: a padded verify step's logit rows equal the unpadded step's (pad rows append
// nothing and nothing reads them).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/graph_step_plan.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

// A batch of sequences with the given (kv_len, q_len), block size 4, sequence s in blocks
// 100 * s, 100 * s + 1, ...; its rows' tokens 1.., positions kv_len - q_len.., and one logit
// row per query row.
ForwardBatch Batch(const std::vector<std::pair<int, int>>& seqs) {
  ForwardBatch b;
  AttentionBatch& a = b.attn;
  a.q_indptr.push_back(0);
  a.page_indptr.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto [kv_len, q_len] = seqs[s];
    for (int p = kv_len - q_len; p < kv_len; ++p) {
      b.logit_rows.push_back(static_cast<int32_t>(b.token_ids.size()));
      b.token_ids.push_back(static_cast<int32_t>(b.token_ids.size()) + 1);
      b.positions.push_back(p);
      a.slot_mapping.push_back(static_cast<int32_t>(100 * s + p / 4) * 4 + p % 4);
    }
    for (int i = 0; i < (kv_len + 3) / 4; ++i) {
      a.page_indices.push_back(static_cast<int32_t>(100 * s) + i);
    }
    a.page_indptr.push_back(static_cast<int32_t>(a.page_indices.size()));
    a.kv_lens.push_back(kv_len);
    a.q_indptr.push_back(static_cast<int32_t>(b.token_ids.size()));
    ++a.num_seqs;
  }
  a.num_tokens = static_cast<int>(b.token_ids.size());
  return b;
}

constexpr GraphLimits kLimits{.max_seqs = 32, .max_q = 5, .max_pages_per_seq = 16};

TEST_CASE("Graph plan: padded sequence buckets", "[graph_plan]") {
  CHECK(GraphSeqBucket(1, 256) == 1);
  CHECK(GraphSeqBucket(2, 256) == 2);
  CHECK(GraphSeqBucket(3, 256) == 4);
  CHECK(GraphSeqBucket(4, 256) == 4);
  CHECK(GraphSeqBucket(5, 256) == 8);
  CHECK(GraphSeqBucket(17, 256) == 24);
  CHECK(GraphSeqBucket(20, 20) == 20);  // never above the graphs' largest batch
}

TEST_CASE("Graph plan: decode and verify steps of one row count replay a graph of it",
          "[graph_plan]") {
  for (int q = 1; q <= 5; ++q) {
    for (int n : {1, 3, 17}) {
      INFO("q = " << q << ", " << n << " sequences");
      std::vector<std::pair<int, int>> seqs(n, {20 + q, q});
      const GraphStepPlan p = PlanGraphStep(Batch(seqs).attn, kLimits);
      CHECK(p.shape == GraphShape{GraphSeqBucket(n, 32), q});
      CHECK(!p.padded);
    }
  }
  // More rows than the graphs take, or than the runner's graphs take at all.
  CHECK(PlanGraphStep(Batch({{20, 5}}).attn, {32, 4, 16}).shape.seqs == 0);
  CHECK(PlanGraphStep(Batch({{20, 1}}).attn, {0, 5, 16}).shape.seqs == 0);
  // A prefill chunk beside decodes, too many sequences, a block table too long for the graphs.
  CHECK(PlanGraphStep(Batch({{20, 1}, {40, 12}}).attn, kLimits).shape.seqs == 0);
  CHECK(PlanGraphStep(Batch(std::vector<std::pair<int, int>>(33, {20, 1})).attn, kLimits)
            .shape.seqs == 0);
  CHECK(PlanGraphStep(Batch({{65, 1}}).attn, kLimits).shape.seqs == 0);
  // A sequence without query rows this step.
  CHECK(PlanGraphStep(Batch({{20, 1}, {20, 0}}).attn, kLimits).shape.seqs == 0);
}

TEST_CASE("Graph plan: a step of mixed row counts pads to its most rows where it can",
          "[graph_plan]") {
  const GraphStepPlan p = PlanGraphStep(Batch({{20, 4}, {9, 1}, {30, 2}}).attn, kLimits);
  CHECK(p.shape == GraphShape{4, 4});
  CHECK(p.padded);
  // A sequence whose cache holds fewer positions than the pad rows would take.
  CHECK(PlanGraphStep(Batch({{20, 4}, {3, 1}}).attn, kLimits).shape.seqs == 0);
  // A freed block (left of a sliding window) in a sequence that would get pad rows: eager; in
  // one that gets none: the graph.
  ForwardBatch freed = Batch({{20, 4}, {20, 1}});
  freed.attn.page_indices[freed.attn.page_indptr[1]] = -1;
  CHECK(PlanGraphStep(freed.attn, kLimits).shape.seqs == 0);
  freed = Batch({{20, 4}, {20, 1}});
  freed.attn.page_indices[0] = -1;
  CHECK(PlanGraphStep(freed.attn, kLimits).shape == GraphShape{2, 4});
}

TEST_CASE("Graph plan: padded rows sit before each short sequence's own", "[graph_plan]") {
  ForwardBatch b = Batch({{20, 3}, {9, 1}, {30, 2}});
  b.logit_rows = {2, 3, 5};  // each sequence's last row
  b.device_sampled = {1, 0, 1};
  b.sampling_jobs.resize(3);
  b.sampling_jobs[1].mask_row = 0;
  const ForwardBatch p = PadQueryRows(b, 3);
  const AttentionBatch& a = p.attn;
  CHECK(a.num_seqs == 3);
  CHECK(a.num_tokens == 9);
  CHECK(UniformQueryRows(a, 3));
  CHECK(!UniformQueryRows(b.attn, 3));
  CHECK(CheckAttentionBatch(a, 4, 400).ok());
  CHECK(a.kv_lens == b.attn.kv_lens);
  CHECK(a.page_indptr == b.attn.page_indptr);
  CHECK(a.page_indices == b.attn.page_indices);
  CHECK(p.token_ids == std::vector<int32_t>{1, 2, 3, 0, 0, 4, 0, 5, 6});
  CHECK(p.positions == std::vector<int32_t>{17, 18, 19, 6, 7, 8, 27, 28, 29});
  const auto& s = b.attn.slot_mapping;
  CHECK(a.slot_mapping == std::vector<int32_t>{s[0], s[1], s[2], -1, -1, s[3], -1, s[4], s[5]});
  CHECK(p.logit_rows == std::vector<int32_t>{2, 5, 8});
  CHECK(p.device_sampled == b.device_sampled);
  REQUIRE(p.sampling_jobs.size() == 3);
  CHECK(p.sampling_jobs[1].mask_row == 0);
  // Already uniform: the same rows.
  const ForwardBatch same = PadQueryRows(Batch({{20, 2}, {9, 2}}), 2);
  CHECK(same.token_ids == Batch({{20, 2}, {9, 2}}).token_ids);
  CHECK(same.attn.slot_mapping == Batch({{20, 2}, {9, 2}}).attn.slot_mapping);
}

// Two sequences prefilled, then a verify-shaped step (4 rows of one, 1 and 2 of the others),
// eager and padded to 4 rows each, on fresh models: the same logits for every real row.
TEST_CASE("Graph plan: a padded verify step gives the unpadded step's logits on the CPU runner",
          "[graph_plan]") {
  const bool deepseek = GENERATE(false, true);
  INFO((deepseek ? "deepseek" : "llama"));
  const test::TinyCheckpoint ck = deepseek ? test::TinyDeepseekV2() : test::TinyLlama("llama");
  test::TempDir dir("graph_step_plan");
  ck.Write(dir.path());
  ModelLoadOptions o;
  o.model_dir = dir.path().string();
  o.block_size = 4;
  o.num_kv_blocks = 400;
  const std::vector<std::pair<int, int>> prompts = {{11, 11}, {7, 7}, {9, 9}};
  const std::vector<std::pair<int, int>> verify = {{15, 4}, {8, 1}, {11, 2}};
  std::vector<float> eager, padded;
  for (bool pad : {false, true}) {
    auto m = LoadModel(o);
    REQUIRE(m.ok());
    std::vector<float> logits;
    REQUIRE((*m)->Forward(Batch(prompts), &logits).ok());
    ForwardBatch step = Batch(verify);
    const GraphStepPlan plan = PlanGraphStep(step.attn, kLimits);
    REQUIRE(plan.padded);
    REQUIRE(plan.shape.q == 4);
    if (pad) step = PadQueryRows(step, plan.shape.q);
    REQUIRE((*m)->Forward(step, pad ? &padded : &eager).ok());
  }
  REQUIRE(eager.size() == 7 * 64);
  REQUIRE(padded.size() == eager.size());
  for (size_t i = 0; i < eager.size(); ++i) CHECK(padded[i] == Approx(eager[i]).margin(1e-4));
}

}  // namespace
}  // namespace llm
