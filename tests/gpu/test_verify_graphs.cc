// Speculative verify steps in CUDA graphs (engine/runtime/graph_step_plan.h): the CUDA runner
// replays a graph captured for (padded sequences, q query rows per sequence), q = 1 + K, and pads
// a step whose sequences have different row counts to its most rows. Two runners of the same
// random model, one with graphs and one eager, take the same steps (a prefill, then one-token,
// verify-shaped and mixed steps at batch 1, 3 and 17) and must return the same logits for every
// row up to bf16 rounding, while the graph runner's graph_steps() counts every step whose shape
// it has captured. Models: a Llama on cuda_c8 and cuda_fmha, a Llama with 8 query heads per KV
// head (several C8 decode tiles per sequence past 2 rows), and a dense DeepSeek-V2 on cuda_mla
// (5 rows: absorbed in the graph, expanded eagerly).
//
//   build/cuda/tests/gpu_tests "[speculative_graph]"
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/graph_step_plan.h"
#include "engine/runtime/model.h"
#include "tests/gpu/random_deepseek.h"
#include "tests/gpu/random_llama.h"

namespace llm {
namespace {

constexpr int kBlockSize = 64;    // cuda_mla's pages are multiples of 64 tokens
constexpr int kBlocksPerSeq = 2;  // 128 positions: the prompt and every step below
constexpr int kMaxRows = 5;       // 1 + K at K = 4
constexpr int kVocab = 600;

// `force`: ModelLoadOptions::attention_backend (empty: the selection's choice).
std::unique_ptr<Model> Load(const std::string& dir, const std::string& force, bool graphs) {
  ModelLoadOptions o;
  o.model_dir = dir;
  o.device = "cuda";
  o.attention_backend = force;
  o.block_size = kBlockSize;
  o.num_kv_blocks = 17 * kBlocksPerSeq + 8;
  o.cuda_graph_max_batch = graphs ? 32 : 0;
  o.cuda_graph_max_query_rows = kMaxRows;
  auto m = LoadModel(o);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return std::move(m).value();
}

// A step in which sequence i consumes rows[i] new random tokens, every row's logits wanted;
// sequence i owns blocks [i * kBlocksPerSeq, (i + 1) * kBlocksPerSeq). Advances lens.
ForwardBatch Step(std::vector<int>* lens, const std::vector<int>& rows, std::mt19937& rng) {
  ForwardBatch b;
  AttentionBatch& a = b.attn;
  a.q_indptr.push_back(0);
  a.page_indptr.push_back(0);
  for (size_t i = 0; i < rows.size(); ++i) {
    int& len = (*lens)[i];
    const int first = static_cast<int>(i) * kBlocksPerSeq;
    for (int p = len; p < len + rows[i]; ++p) {
      b.logit_rows.push_back(static_cast<int32_t>(b.token_ids.size()));
      b.token_ids.push_back(static_cast<int32_t>(rng() % kVocab));
      b.positions.push_back(p);
      a.slot_mapping.push_back((first + p / kBlockSize) * kBlockSize + p % kBlockSize);
    }
    len += rows[i];
    REQUIRE(len <= kBlocksPerSeq * kBlockSize);
    for (int k = 0; k < (len + kBlockSize - 1) / kBlockSize; ++k)
      a.page_indices.push_back(first + k);
    a.page_indptr.push_back(static_cast<int32_t>(a.page_indices.size()));
    a.kv_lens.push_back(len);
    a.q_indptr.push_back(static_cast<int32_t>(b.token_ids.size()));
    ++a.num_seqs;
  }
  a.num_tokens = static_cast<int>(b.token_ids.size());
  return b;
}

// Every logit row of the graph runner within bf16 rounding of the eager one's: the largest
// difference at most 3% of the row's largest |logit| (a wrong position, a lost K/V row or a row
// read from a pad row would move logits by their whole range).
void CheckRows(const std::string& what, const std::vector<float>& eager,
               const std::vector<float>& graph, int rows) {
  REQUIRE(eager.size() == static_cast<size_t>(rows) * kVocab);
  REQUIRE(graph.size() == eager.size());
  for (int r = 0; r < rows; ++r) {
    float scale = 0.f, diff = 0.f;
    bool finite = true;
    for (int v = 0; v < kVocab; ++v) {
      const float e = eager[static_cast<size_t>(r) * kVocab + v];
      const float g = graph[static_cast<size_t>(r) * kVocab + v];
      finite &= std::isfinite(g);
      scale = std::max(scale, std::fabs(e));
      diff = std::max(diff, std::fabs(e - g));
    }
    INFO(what << ", logit row " << r << ": max |graph - eager| " << diff << ", max |logit| "
              << scale);
    CHECK(finite);
    CHECK(diff <= 0.03f * scale);
  }
}

// The steps both runners take after the prompts: each row pattern twice (the second replays the
// graph the first captured, where the warm-up had not).
std::vector<std::vector<int>> Schedule(int n) {
  std::vector<std::vector<int>> pattern;
  pattern.push_back(std::vector<int>(n, 1));
  for (int q = 2; q <= kMaxRows; ++q) pattern.push_back(std::vector<int>(n, q));
  std::vector<int> mixed(n), paused(n);
  for (int i = 0; i < n; ++i) {
    mixed[i] = 1 + i % 4;                   // adaptive draft lengths
    paused[i] = i % 2 == 0 ? kMaxRows : 1;  // some sequences not speculating
  }
  pattern.push_back(mixed);
  pattern.push_back(paused);
  std::vector<std::vector<int>> steps;
  for (const auto& p : pattern) {
    steps.push_back(p);
    steps.push_back(p);
  }
  return steps;
}

// `backend` is forced, except cuda_mla (DeepSeek's selection).
void CheckVerifyGraphs(const std::string& name, const std::string& dir,
                       const std::string& backend) {
  const std::string force = backend == "cuda_mla" ? "" : backend;
  auto eager = Load(dir, force, false);
  auto graph = Load(dir, force, true);
  REQUIRE(graph->attention_backend_name() == backend);
  const GraphLimits limits{32, kMaxRows, 2048 / kBlockSize};
  for (int n : {1, 3, 17}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::vector<int> lens(n, 0);
    std::vector<int> prompt(n);
    for (int i = 0; i < n; ++i) prompt[i] = 9 + (i * 7) % 23;
    std::vector<float> le, lg;
    // The prompts (eager on both: a prefill).
    const ForwardBatch first = Step(&lens, prompt, rng);
    REQUIRE(eager->Forward(first, &le).ok());
    REQUIRE(graph->Forward(first, &lg).ok());
    int step = 0;
    for (const std::vector<int>& rows : Schedule(n)) {
      const ForwardBatch b = Step(&lens, rows, rng);
      const GraphStepPlan plan = PlanGraphStep(b.attn, limits);
      const int q = *std::max_element(rows.begin(), rows.end());
      REQUIRE(plan.shape.q == q);
      REQUIRE(plan.padded == (*std::min_element(rows.begin(), rows.end()) < q));
      const int64_t before = graph->graph_steps();
      REQUIRE(eager->Forward(b, &le).ok());
      REQUIRE(graph->Forward(b, &lg).ok());
      const std::string what = name + ", " + std::to_string(n) + " sequences, step " +
                               std::to_string(step) + " (" + std::to_string(q) + " rows" +
                               (plan.padded ? ", padded)" : ")");
      CheckRows(what, le, lg, b.attn.num_tokens);
      // A shape's second step replays its graph; the warm-up captured q = 1 and q = 5 already.
      INFO(what);
      if (step % 2 == 1 || q == 1 || q == kMaxRows) CHECK(graph->graph_steps() == before + 1);
      CHECK(eager->graph_steps() == 0);
      ++step;
    }
  }
}

TEST_CASE("GPU verify steps replayed from CUDA graphs give the eager logits (Llama)",
          "[gpu][speculative_graph]") {
  const std::string dir = gpu_test::WriteRandomLlama("llama_verify_graphs");
  for (const std::string backend : {"cuda_c8", "cuda_fmha"}) {
    INFO(backend);
    CheckVerifyGraphs("llama " + backend, dir, backend);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("GPU verify steps in CUDA graphs over several C8 decode tiles per sequence",
          "[gpu][speculative_graph]") {
  // 16 query heads over 2 KV heads: a C8 decode tile holds 2 query rows of a sequence, so 3..5
  // rows take 2 or 3 tiles (C8PlanConfig::decode_query_len), which eager steps send to the
  // prefill tiles.
  const std::string dir =
      gpu_test::WriteRandomDense("llama_gqa8_verify_graphs", gpu_test::RandomArch::kLlama, 64, 0,
                                 /*heads=*/16);
  CheckVerifyGraphs("llama GQA 8 cuda_c8", dir, "cuda_c8");
  std::filesystem::remove_all(dir);
}

TEST_CASE("GPU DeepSeek verify steps replayed from CUDA graphs give the eager logits",
          "[gpu][speculative_graph][deepseek]") {
  // Dense layers only: a routing near-tie between two batch shapes would change a row's experts.
  const std::string dir =
      gpu_test::WriteRandomDeepseek("v2_verify_graphs", false, nullptr, /*dense_only=*/true);
  CheckVerifyGraphs("deepseek cuda_mla", dir, "cuda_mla");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llm
