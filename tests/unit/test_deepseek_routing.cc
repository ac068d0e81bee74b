// The DeepSeekMoE gate on the CPU (engine/layers/moe_router.h): selections and margins on
// hand-made scores where the answer can be worked out by hand (exact and near ties of experts and
// of groups, a group gap that cannot change the selection), and the routing record of DeepSeek on
// the CPU runner through EngineCore::set_routing_observer, keyed by request and position across
// prefill chunks and decode steps.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_core.h"
#include "engine/layers/moe_router.h"
#include "engine/loader/deepseek_config.h"
#include "engine/loader/safetensors.h"
#include "tests/gpu/engine_generate.h"  // device-neutral: drives the CPU model here
#include "tests/unit/tiny_checkpoint.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using Method = DeepseekConfig::TopkMethod;
using Scoring = DeepseekConfig::Scoring;

DeepseekConfig Gate(Scoring scoring, Method method, int experts, int top_k, int groups,
                    int topk_group) {
  DeepseekConfig d;
  d.base.architecture = Architecture::kDeepseekV3;
  d.n_routed_experts = experts;
  d.num_experts_per_tok = top_k;
  d.scoring = scoring;
  d.topk_method = method;
  d.n_group = groups;
  d.topk_group = topk_group;
  d.norm_topk_prob = true;
  d.routed_scaling_factor = 2.5f;
  return d;
}

struct Routed {
  std::vector<int32_t> experts;  // selection order
  std::vector<float> weights;
  float margin = NAN;
};

// Routes one token twice, with and without the margin, and checks that both select alike.
Routed Route(const DeepseekConfig& d, const std::vector<float>& logits,
             const std::vector<float>& bias) {
  const int K = d.num_experts_per_tok;
  Routed r{std::vector<int32_t>(K), std::vector<float>(K)};
  MoeRouter router(d.Routing());
  router.Route(logits.data(), bias.empty() ? nullptr : bias.data(), r.experts.data(),
               r.weights.data(), &r.margin);
  std::vector<int32_t> experts(K);
  std::vector<float> weights(K);
  router.Route(logits.data(), bias.empty() ? nullptr : bias.data(), experts.data(), weights.data(),
               nullptr);
  CHECK(experts == r.experts);
  CHECK(weights == r.weights);
  return r;
}

double Sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// noaux_tc over 8 experts in 4 groups of 2 (keep 2), top 2, all logits 0: every score is
// sigmoid(0) = 0.5, so the selection scores are 0.5 + bias. Group scores (sum of both):
//   group 0 {0.59, 0.50} 1.09   group 1 {0.80, 0.30} 1.10   group 2 {0.95, 0.70} 1.65
//   group 3 {0.20, 0.20} 0.40
// Kept: groups 2 and 1; best dropped: group 0, 0.01 below group 1. Experts: 4 (0.95), 2 (0.80);
// best unselected 5 (0.70): expert gap 0.10. Keeping group 0 instead of group 1 selects {4, 5}:
// the group gap counts, margin 0.01.
const std::vector<float> kGroupTieBias = {0.09f, 0.0f, 0.30f, -0.20f, 0.45f, 0.20f, -0.30f, -0.30f};

TEST_CASE("DeepSeek router: exact expert tie goes to the lower index at margin 0", "[routing]") {
  // softmax greedy, top 1: experts 1 and 2 have the same logit, so the same probability.
  const DeepseekConfig d = Gate(Scoring::kSoftmax, Method::kGreedy, 4, 1, 1, 1);
  const Routed r = Route(d, {1.0f, 3.0f, 3.0f, 0.0f}, {});
  CHECK(r.experts == std::vector<int32_t>{1});
  CHECK(r.margin == 0.0f);
}

TEST_CASE("DeepSeek router: greedy margin is the gap to the best unselected expert", "[routing]") {
  // sigmoid greedy, top 2 of 5: selected 1 (2.0) and 2 (1.9); best unselected 4 (1.5).
  const DeepseekConfig d = Gate(Scoring::kSigmoid, Method::kGreedy, 5, 2, 1, 1);
  const Routed r = Route(d, {0.0f, 2.0f, 1.9f, -1.0f, 1.5f}, {});
  CHECK(r.experts == std::vector<int32_t>{1, 2});
  CHECK(r.margin == Approx(Sigmoid(1.9) - Sigmoid(1.5)).margin(1e-6));
  CHECK(r.margin > 0.05f);  // 0.0523: not a near-tie
  // Normalized sigmoid scores times 2.5.
  const double s1 = Sigmoid(2.0), s2 = Sigmoid(1.9);
  CHECK(r.weights[0] == Approx(2.5 * s1 / (s1 + s2)).margin(1e-5));
  CHECK(r.weights[1] == Approx(2.5 * s2 / (s1 + s2)).margin(1e-5));
}

TEST_CASE("DeepSeek router: a near-tie of groups sets the margin when it changes the experts",
          "[routing]") {
  const DeepseekConfig d = Gate(Scoring::kSigmoid, Method::kNoauxTc, 8, 2, 4, 2);
  const Routed r = Route(d, std::vector<float>(8, 0.0f), kGroupTieBias);
  CHECK(r.experts == std::vector<int32_t>{4, 2});
  CHECK(r.margin == Approx(0.01).margin(1e-6));
  // noaux_tc weighs with the unbiased scores: 0.5 / (0.5 + 0.5) * 2.5.
  CHECK(r.weights[0] == Approx(1.25f));
  CHECK(r.weights[1] == Approx(1.25f));
}

TEST_CASE("DeepSeek router: a near-tie of groups that cannot change the experts is not counted",
          "[routing]") {
  // As kGroupTieBias, but group 2 holds both selected experts: {0.95, 0.90}. Experts 4, 5; best
  // unselected 2 (0.80): expert gap 0.10. Groups 1 and 0 are still 0.01 apart, but keeping
  // group 0 (best 0.59) instead of group 1 selects 4 and 5 all the same.
  std::vector<float> bias = kGroupTieBias;
  bias[5] = 0.40f;
  const DeepseekConfig d = Gate(Scoring::kSigmoid, Method::kNoauxTc, 8, 2, 4, 2);
  const Routed r = Route(d, std::vector<float>(8, 0.0f), bias);
  CHECK(r.experts == std::vector<int32_t>{4, 5});
  CHECK(r.margin == Approx(0.10).margin(1e-6));
}

// A dropped group's experts are never chosen, even over negative selection scores (a sigmoid
// score plus a negative bias): DeepSeek's reference and transformers 5 mask them with -inf
// (transformers 4's 0.0 would take expert 4 here). noaux_tc, 8 experts in 2 groups of 4, keep 1,
// top 3, logits 0 (scores 0.5): group 0 choices {0.6, 0.5, -0.1, -0.2} (top two 1.1), group 1
// {-0.4, -0.45, -0.45, -0.5} (top two -0.85). Experts 0, 1, 2; the best unselected kept expert
// is 3 (-0.2): margin 0.1 (the group gap, 1.95, cannot win).
TEST_CASE("DeepSeek router: experts of dropped groups lose to negative selection scores",
          "[routing]") {
  const DeepseekConfig d = Gate(Scoring::kSigmoid, Method::kNoauxTc, 8, 3, 2, 1);
  const std::vector<float> bias = {0.1f, 0.0f, -0.6f, -0.7f, -0.9f, -0.95f, -0.95f, -1.0f};
  const Routed r = Route(d, std::vector<float>(8, 0.0f), bias);
  CHECK(r.experts == std::vector<int32_t>{0, 1, 2});
  CHECK(r.margin == Approx(0.1).margin(1e-6));
}

TEST_CASE("DeepSeek router: group_limited_greedy exact group tie", "[routing]") {
  // softmax over {0, 2, 2, 0}, 2 groups of 2, keep 1, top 1: both groups score max p = p(2);
  // group 0 wins the tie (lower index) and selects expert 1; keeping group 1 would select
  // expert 2, so the group gap (0) counts although the expert gap is p(2) - p(0).
  DeepseekConfig d = Gate(Scoring::kSoftmax, Method::kGroupLimitedGreedy, 4, 1, 2, 1);
  d.base.architecture = Architecture::kDeepseekV2;
  d.norm_topk_prob = false;
  d.routed_scaling_factor = 1.0f;
  const Routed r = Route(d, {0.0f, 2.0f, 2.0f, 0.0f}, {});
  CHECK(r.experts == std::vector<int32_t>{1});
  CHECK(r.margin == 0.0f);
  const double p = std::exp(2.0) / (2 * std::exp(2.0) + 2);
  CHECK(r.weights[0] == Approx(p).margin(1e-6));  // the masked top-k value, unscaled
}

// A tiny random DeepSeek-V3 (fp32 safetensors) in `dir` whose MoE routers are zero, so that every
// token's selection scores are 0.5 + kGroupTieBias at both MoE layers (1 and 2).
void WriteZeroRouterDeepseek(const fs::path& dir) {
  const int layers = 3, moe_inter = 8, experts = 8;
  // TinyDeepseekV2's dimensions (hidden 32, 2 heads, MLA 16 + rope 8, vocab 64), as a V3 with
  // noaux_tc routing over 8 experts in 4 groups after one dense layer.
  test::TinyCheckpoint c;
  c.config = test::TinyDeepseekV2().config;
  c.config.update({{"architectures", {"DeepseekV3ForCausalLM"}},
                   {"model_type", "deepseek_v3"},
                   {"moe_intermediate_size", moe_inter},
                   {"num_hidden_layers", layers},
                   {"n_routed_experts", experts},
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
                   {"attention_bias", false},
                   {"torch_dtype", "float32"}});
  test::AddTinyDeepseekMoeTensors(
      &c, {.std = 0.2f, .router_std = 0.0f, .router_bias_std = 0.0f, .seed = 11000});
  for (int l = 1; l < layers; ++l) {  // router logits exactly 0, the tie bias at both MoE layers
    const std::string bias =
        "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias";
    std::memcpy(c.Find(bias)->data.data(), kGroupTieBias.data(), experts * 4);
  }
  c.Write(dir);
}

TEST_CASE("CPU DeepSeek records every routing decision by request, position and layer",
          "[routing]") {
  test::TempDir tmp("deepseek_routing");
  WriteZeroRouterDeepseek(tmp.path());
  const std::string dir = tmp.path().string();
  // Prompts of 7 and 40 tokens under a 16-token budget: prefill chunks beside decode steps.
  const std::vector<std::vector<int32_t>> prompts = {std::vector<int32_t>(7, 5),
                                                     std::vector<int32_t>(40, 9)};
  const int steps = 5;
  gpu_test::Routing routing;
  const auto result = gpu_test::Generate(dir, prompts,
                                         {.device = "cpu",
                                          .block_size = 16,
                                          .num_kv_blocks = 16,
                                          .max_batched_tokens = 16,
                                          .steps = steps,
                                          .routing = &routing});
  REQUIRE(result.tokens.size() == 2);
  REQUIRE(routing.size() == 2);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    const auto& trace = routing.at(std::to_string(i));
    // Positions 0 .. P + steps - 2 were computed (the last token is sampled, never fed back),
    // each at MoE layers 1 and 2.
    const int positions = static_cast<int>(prompts[i].size()) + steps - 1;
    CHECK(trace.size() == static_cast<size_t>(positions) * 2);
    int expected_position = 0, expected_layer = 1;
    for (const auto& [key, d] : trace) {
      INFO("position " << key.first << " layer " << key.second);
      CHECK(key.first == expected_position);
      CHECK(key.second == expected_layer);
      CHECK(d.position == key.first);
      CHECK(d.layer == key.second);
      CHECK(d.experts == std::vector<int32_t>{2, 4});  // ascending
      CHECK(d.margin == Approx(0.01).margin(1e-6));
      if (++expected_layer == 3) {
        expected_layer = 1;
        ++expected_position;
      }
    }
  }
}

TEST_CASE(
    "mla_kernel: unknown values fail the load, and models without routing refuse the observer",
    "[routing]") {
  test::TempDir tmp("deepseek_routing");
  WriteZeroRouterDeepseek(tmp.path());
  EngineConfig cfg;
  cfg.model.model_dir = tmp.path().string();
  cfg.model.block_size = 16;
  cfg.model.num_kv_blocks = 16;
  cfg.require_tokenizer = false;
  cfg.model.mla_kernel = "fast";
  auto bad = EngineCore::Create(cfg);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message() == "mla_kernel must be one of auto, wgmma, portable, got 'fast'");
  cfg.model.mla_kernel = "portable";  // a CUDA choice: refused on the CPU, not ignored
  auto cpu = EngineCore::Create(cfg);
  REQUIRE_FALSE(cpu.ok());
  CHECK(cpu.status().message() ==
        "mla_kernel portable: a kernel choice of the cuda device (the cpu device attends every "
        "step through one backend)");

  cfg.model.model_dir = "synthetic:vocab=40,max_len=64";
  cfg.model.mla_kernel = "auto";
  auto synthetic = EngineCore::Create(cfg);
  REQUIRE(synthetic.ok());
  const Status st =
      (*synthetic)->set_routing_observer([](const std::string&, const MoeRoutingDecision&) {
        FAIL("no routing expected");
      });
  CHECK(st.code() == StatusCode::kFailedPrecondition);
  CHECK((*synthetic)->set_routing_observer(nullptr).ok());
}

}  // namespace
}  // namespace llm
