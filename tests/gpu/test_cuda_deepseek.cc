// The DeepSeek-V2/V3 model on the GPU (cuBLAS + deepseek_ops + cuda_mla) against the CPU
// definition (cpu_deepseek_decoder), through the real EngineCore: greedy tokens over 64 steps for
// tiny random models with a bf16 latent cache (identical up to genuine near-ties), on the default
// MLA kernel choice (the sm_90a wgmma kernel on Hopper builds) and, where that is wgmma, on the
// portable kernel (mla_kernel portable), and the fp8 latent cache's agreement with the CPU fp8 run.
// Prompts of 5..150 tokens under max_batched_tokens 48 give prefill chunks of more than 4 rows
// (expanded-heads path) beside 1..4-row chunks and decodes (absorbed path through cuda_mla), with 3
// sequences in flight. Decode steps replayed from CUDA graphs give the eager steps' tokens, with
// and without MoE layers.
//
//   build/.../tests/gpu_tests "[deepseek]"
//
// A divergence is accepted at a near-tie of the LM head (CPU top-2 gap) or of the MoE router: both
// runs record every routing decision (EngineCore::set_routing_observer), and the first (position,
// layer) where the GPU chose other experts and that can reach the divergent step's logits must be
// a CPU router near-tie. Every divergence is printed with its step, both tokens, the CPU top-2
// gap and the first routing mismatches, so a failing run says whether it was a near-tie or a
// real bug.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "engine/engine_core.h"
#include "engine/loader/safetensors.h"
#include "kernels/cuda/mla/mla_decode.h"
#include "tests/gpu/engine_generate.h"
#include "tests/gpu/random_deepseek.h"
#include "tests/gpu/random_fp8_llama.h"
#include "tests/gpu/random_llama.h"

namespace llm {
namespace {

using gpu_test::RandomBf16Tensor;

namespace fs = std::filesystem;

constexpr int kVocab = gpu_test::kRandomDeepseekVocab;
constexpr int kSteps = 64;
constexpr int kLayers = gpu_test::kRandomDeepseekLayers;  // 0 dense, 1 and 2 MoE
constexpr int kMoeLayers = 2;                             // layers 1 and 2

using gpu_test::WriteRandomDeepseek;

using gpu_test::Gaps;
using RoutingTrace = std::map<std::pair<int, int>, MoeRoutingDecision>;  // (position, layer)

struct Run {
  std::vector<std::vector<int32_t>> tokens;  // per prompt
  gpu_test::Routing routing;                 // per prompt ("0", "1", ...)
};

// Greedy tokens of all prompts submitted together (continuous batching, chunked prefill) and
// every routing decision. With gaps, every row returns logits (host argmax) and the top-2 gaps
// are recorded.
Run Generate(const std::string& dir, const std::string& device, const std::string& kv_dtype,
             const std::vector<std::vector<int32_t>>& prompts, Gaps* gaps,
             const std::string& mla_kernel = "auto") {
  Run run;
  run.tokens = gpu_test::Generate(dir, prompts,
                                  {.device = device,
                                   .kv_dtype = kv_dtype,
                                   .block_size = 64,  // cuda_mla's minimum
                                   .num_kv_blocks = 64,
                                   .mla_kernel = mla_kernel,
                                   .steps = kSteps,
                                   .gaps = gaps,
                                   .routing = &run.routing})
                   .tokens;
  return run;
}

std::vector<std::vector<int32_t>> Prompts() {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {5, 70, 150}) {
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(rng() % kVocab);
    prompts.push_back(p);
  }
  return prompts;
}

// bf16 weights and activations on the GPU against fp32 on the CPU move logits by ~1e-3 of their
// range (test_cuda_model.cc's rule): sequences must be identical until a step whose CPU top-2
// gap is below kTieGap, or until a routing near-tie (below).
constexpr float kTieGap = 5e-3f;

// MoE routing has near-ties of its own: an expert set that flips at one (token, layer) changes
// that token's hidden state by a lot, and the tokens diverge later at a clear logit gap. Such a
// divergence is accepted when the first routing mismatch that can reach its logits
// (CompareRouting) is at a CPU router margin (moe_router.h: the gap in selection-score
// units between the last selected and the best unselected expert, or between the last kept and
// the best dropped group) below this. Why 2e-2: the GPU's router GEMM is fp32 over bf16
// activations and bf16 router weights, and the hidden state it reads carries the bf16 drift that
// kTieGap allows on the LM head, ~1e-3 relative; on router logits of std ~2.4 (up to ~7) that is
// up to ~1e-2 in logit units. Sigmoid and softmax probabilities move by at most 1/4 of a logit
// change, so selection scores move by a few 1e-3, a noaux_tc group score (the sum of two) by
// twice that. The flips seen so far came at smaller CPU margins (fp8 cache included; figures in
// docs/log/PERFORMANCE_NOTEBOOK.md), so 2e-2 leaves room above what rounding did; a first
// reaching mismatch at a larger margin is not rounding.
constexpr float kRouterTieMargin = 2e-2f;

// What every bf16 GPU run must keep besides explaining each divergence: on average at least this
// many identical leading steps of 64. A defect diverges within the first few steps, while the
// kernels' rounding parts runs only at logit near-ties, mostly late (the measured prefixes are in
// docs/log/PERFORMANCE_NOTEBOOK.md); a run that passed the former "one of 3 identical" rule has at
// least 64 / 3. (The fp8 test checks every step on the GPU's context instead: see there.)
constexpr double kMinMeanPrefix = 16.0;

struct RoutingMismatch {
  int position = 0, layer = 0;
  std::vector<int32_t> cpu, gpu;  // expert ids, ascending
  float cpu_margin = 0;
};

std::string Experts(const std::vector<int32_t>& e) {
  std::string s = "{";
  for (size_t i = 0; i < e.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(e[i]);
  }
  return s + "}";
}

// Where the GPU chose another expert set than the CPU, among the decisions at positions <=
// `position` (the runs fed identical tokens up to there; both traces must hold every MoE layer at
// every one of those positions).
//   first:    the first mismatch in (position, layer) order.
//   reaching: the first, in that order, of those that can change the logits at `position`. A
//             decision at (p, l) changes token p's residual stream after layer l, so it reaches
//             position p's own logits and, through the attention of the layers after l, every
//             later position; at the last layer it reaches p's logits only (a prompt position's
//             are never sampled). No earlier mismatch can have caused `reaching`: a decision at
//             (p, l) depends on routing only at positions <= p and layers < l, all of which reach.
struct RoutingDiff {
  std::optional<RoutingMismatch> first, reaching;
};

RoutingDiff CompareRouting(const RoutingTrace& cpu, const RoutingTrace& gpu, int position) {
  RoutingDiff diff;
  int compared = 0;
  for (const auto& [key, c] : cpu) {
    if (key.first > position) break;
    ++compared;
    const auto it = gpu.find(key);
    INFO("position " << key.first << " layer " << key.second);
    REQUIRE(it != gpu.end());  // the GPU trace misses a decision the CPU made
    if (it->second.experts == c.experts) continue;
    const RoutingMismatch m{key.first, key.second, c.experts, it->second.experts, c.margin};
    if (!diff.first) diff.first = m;
    if (!diff.reaching && (key.first == position || key.second < kLayers - 1)) diff.reaching = m;
  }
  INFO("routing decisions up to position " << position);
  CHECK(compared == (position + 1) * kMoeLayers);
  return diff;
}

std::string Describe(const char* what, const RoutingMismatch& m) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%s at position %d layer %d: cpu experts %s, gpu experts %s, CPU router margin "
                "%.2e (near-tie below %.0e)",
                what, m.position, m.layer, Experts(m.cpu).c_str(), Experts(m.gpu).c_str(),
                m.cpu_margin, kRouterTieMargin);
  return buf;
}

struct Agreement {
  int identical = 0;
  int router_ties = 0;     // divergences accepted through a router near-tie only
  double mean_prefix = 0;  // mean number of identical leading steps
};

Agreement Compare(const std::string& what, const std::vector<std::vector<int32_t>>& prompts,
                  const Run& cpu, const Gaps& gaps, const Run& gpu, float tie_gap) {
  Agreement a;
  const auto& ref = cpu.tokens;
  const auto& got = gpu.tokens;
  REQUIRE(ref.size() == prompts.size());
  REQUIRE(got.size() == prompts.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(ref[i].size() == kSteps);
    REQUIRE(got[i].size() == kSteps);
    const std::string id = std::to_string(i);
    size_t k = 0;
    while (k < kSteps && got[i][k] == ref[i][k]) ++k;
    a.mean_prefix += static_cast<double>(k) / ref.size();
    int mismatches = 0;
    for (size_t j = 0; j < kSteps; ++j) mismatches += got[i][j] != ref[i][j];
    // Step j's token comes from the logits at position P - 1 + j (P the prompt length). Up to the
    // divergent step's position both runs fed the same tokens, so their routing decisions there
    // are comparable; an identical run is compared up to its last computed position, P + 62.
    const int last_position =
        static_cast<int>(prompts[i].size()) - 1 + static_cast<int>(std::min<size_t>(k, kSteps - 1));
    REQUIRE(cpu.routing.count(id) == 1);
    REQUIRE(gpu.routing.count(id) == 1);
    const RoutingDiff rd = CompareRouting(cpu.routing.at(id), gpu.routing.at(id), last_position);
    std::string routing = "no routing mismatch at positions <= " + std::to_string(last_position);
    if (rd.first) routing = Describe("first routing mismatch", *rd.first);
    if (k == kSteps) {
      ++a.identical;
      std::printf("%s prompt %zu: identical over %d steps; %s\n", what.c_str(), i, kSteps,
                  routing.c_str());
      continue;
    }
    const float gap = gaps.at(id).at(k);
    if (rd.first && !(rd.reaching && rd.reaching->position == rd.first->position &&
                      rd.reaching->layer == rd.first->layer)) {
      routing += "; ";
      routing += rd.reaching ? Describe("first that reaches this step", *rd.reaching)
                             : std::string("none of the mismatches reaches this step");
    }
    std::printf(
        "%s prompt %zu: first divergence at step %zu (position %d; cpu %d, gpu %d), CPU top-2 gap "
        "%.2e of max |logit| (near-tie below %.0e); %d of %d steps differ after it; %s\n",
        what.c_str(), i, k, last_position, ref[i][k], got[i][k], gap, tie_gap, mismatches, kSteps,
        routing.c_str());
    const bool logit_tie = gap < tie_gap;
    const bool router_tie = rd.reaching && rd.reaching->cpu_margin < kRouterTieMargin;
    a.router_ties += !logit_tie && router_tie;
    INFO(what << " prompt " << i << ": first divergence at step " << k << ", CPU top-2 gap " << gap
              << "; " << routing);
    CHECK((logit_tie || router_tie));
  }
  return a;
}

// Every GPU step after a divergence, against the CPU on the GPU's own context: two free runs
// that part at a near-tie then follow different texts, so their agreement afterwards says
// nothing about the kernels. For prompt i and step k, the CPU computes the logits after prompt +
// gpu[0..k) (64 - k0 requests of one step each, k0 the first divergence), and the GPU's token
// must be the CPU's argmax there, or within tie_gap of it (relative to max |logit|), or be
// reached by a routing mismatch at a CPU router near-tie (the GPU computed that context with its
// own routing). A kernel error shows as a GPU token the CPU ranks clearly lower, at any step.
struct StepCheck {
  int steps = 0, argmax = 0, logit_ties = 0, router_ties = 0;
};

StepCheck CheckOnGpuContext(const std::string& what, const std::string& dir,
                            const std::string& kv_dtype,
                            const std::vector<std::vector<int32_t>>& prompts, const Run& cpu,
                            const Run& gpu, float tie_gap) {
  StepCheck sc;
  for (size_t i = 0; i < prompts.size(); ++i) {
    size_t k0 = 0;
    while (k0 < kSteps && gpu.tokens[i][k0] == cpu.tokens[i][k0]) ++k0;
    sc.steps += static_cast<int>(k0);  // same context, same token as the CPU's own argmax
    sc.argmax += static_cast<int>(k0);
    if (k0 == kSteps) continue;
    std::vector<std::vector<int32_t>> contexts;
    for (size_t k = k0; k < kSteps; ++k) {
      std::vector<int32_t> c = prompts[i];
      c.insert(c.end(), gpu.tokens[i].begin(), gpu.tokens[i].begin() + k);
      contexts.push_back(std::move(c));
    }
    gpu_test::Logits logits;
    gpu_test::Routing routing;
    gpu_test::Generate(dir, contexts,
                       {.device = "cpu",
                        .kv_dtype = kv_dtype,
                        .block_size = 64,
                        .num_kv_blocks = static_cast<int>(contexts.size()) * 4 + 8,
                        .max_batched_tokens = 4096,
                        .steps = 1,
                        .logits = &logits,
                        .routing = &routing});
    const RoutingTrace& gpu_routing = gpu.routing.at(std::to_string(i));
    for (size_t k = k0; k < kSteps; ++k) {
      const std::string id = std::to_string(k - k0);
      REQUIRE(logits.count(id) == 1);
      const std::vector<float>& l = logits.at(id).front();
      const int32_t tok = gpu.tokens[i][k];
      const int best = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
      float m = 0.f;
      for (float x : l) m = std::max(m, std::fabs(x));
      ++sc.steps;
      if (tok == best || l[tok] == l[best]) {
        ++sc.argmax;
        continue;
      }
      const float gap = (l[best] - l[tok]) / std::max(m, 1e-6f);
      if (gap < tie_gap) {
        ++sc.logit_ties;
        continue;
      }
      const int position = static_cast<int>(prompts[i].size() + k) - 1;
      const RoutingDiff rd = CompareRouting(routing.at(id), gpu_routing, position);
      const bool router_tie = rd.reaching && rd.reaching->cpu_margin < kRouterTieMargin;
      sc.router_ties += router_tie;
      std::printf(
          "%s prompt %zu step %zu: gpu %d, CPU argmax %d on the GPU's context, gap %.2e; %s\n",
          what.c_str(), i, k, tok, best, gap,
          rd.reaching ? Describe("reaching routing mismatch", *rd.reaching).c_str()
                      : "no reaching routing mismatch");
      INFO(what << " prompt " << i << " step " << k << ": the CPU ranks the GPU's token " << gap
                << " of max |logit| below its argmax on the same context");
      CHECK(router_tie);
    }
  }
  std::printf(
      "%s, every step on the GPU's context: %d steps, %d the CPU's argmax, %d within the logit "
      "near-tie, %d after a router near-tie\n",
      what.c_str(), sc.steps, sc.argmax, sc.logit_ties, sc.router_ties);
  return sc;
}

TEST_CASE("GPU DeepSeek matches the CPU model over 64 greedy steps (bf16 latent cache)",
          "[gpu][deepseek]") {
  // mla_kernel auto (the default: every decode item on the sm_90a wgmma kernel where the device
  // and build allow it), then, where that is wgmma, every item on the portable kernel.
  std::vector<std::string> kernels = {"auto"};
  if (cuda::MlaWgmmaAvailable()) {
    kernels.push_back("portable");
  } else {
    std::printf(
        "DeepSeek bf16: auto is the portable kernel here (the wgmma one needs a compute "
        "capability 9.0 device and a build with sm_90a); no second run\n");
  }
  const auto prompts = Prompts();
  for (bool v3 : {false, true}) {
    const std::string name = v3 ? "v3_noaux_tc" : "v2_qlora_group";
    const std::string dir = WriteRandomDeepseek(name, v3, nullptr);
    Gaps gaps;
    const Run cpu = Generate(dir, "cpu", "auto", prompts, &gaps);
    for (const std::string& kernel : kernels) {
      const std::string what = name + " bf16 mla_kernel=" + kernel;
      const Run gpu = Generate(dir, "cuda", "auto", prompts, nullptr, kernel);
      const Agreement a = Compare(what, prompts, cpu, gaps, gpu, kTieGap);
      std::printf(
          "%s: %d of 3 identical, %d divergences explained by a router near-tie only, mean "
          "identical prefix %.1f of %d steps\n",
          what.c_str(), a.identical, a.router_ties, a.mean_prefix, kSteps);
      INFO(what << ": mean identical prefix " << a.mean_prefix);
      CHECK(a.mean_prefix >= kMinMeanPrefix);
      CheckOnGpuContext(what, dir, "auto", prompts, cpu, gpu, kTieGap);
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("GPU DeepSeek fp8 latent cache tracks the CPU fp8 run", "[gpu][deepseek]") {
  // Same fp8 storage definition on both sides (base/quant.h, scale 1.0 from config), so
  // the runs track each other; 8-bit rounding of bf16-vs-fp32 differences makes near-ties come
  // sooner, so the bounds are looser: the first divergence at a CPU gap under 2e-2 (or a router
  // near-tie, as for bf16), and every later step checked on the GPU's own context with the same
  // bound. The free runs' mean identical prefix is printed, not bounded: three fp8 prompts part at
  // near-ties early or late by chance (the two kernels' prefixes differ widely while their error
  // against the CPU reference is the same), so it measures trajectory chaos; the step check on the
  // GPU's context measures the kernels.
  const std::string dir = WriteRandomDeepseek("v2_fp8", false, "fp8_e4m3");
  const auto prompts = Prompts();
  Gaps gaps;
  const Run cpu = Generate(dir, "cpu", "fp8_e4m3", prompts, &gaps);
  // The default (16-row decode items on the transposed wgmma kernel on Hopper), then, where that
  // is wgmma, the portable kernel.
  std::vector<std::string> kernels = {"auto"};
  if (cuda::MlaWgmmaAvailable()) kernels.push_back("portable");
  for (const std::string& kernel : kernels) {
    const std::string what = "v2 fp8 mla_kernel=" + kernel;
    const Run gpu = Generate(dir, "cuda", "fp8_e4m3", prompts, nullptr, kernel);
    const Agreement a = Compare(what, prompts, cpu, gaps, gpu, 2e-2f);
    std::printf(
        "%s: %d of 3 identical, %d divergences explained by a router near-tie only, mean "
        "identical prefix %.1f of %d steps\n",
        what.c_str(), a.identical, a.router_ties, a.mean_prefix, kSteps);
    const StepCheck sc = CheckOnGpuContext(what, dir, "fp8_e4m3", prompts, cpu, gpu, 2e-2f);
    CHECK(sc.steps == 3 * kSteps);
  }
  fs::remove_all(dir);
}

// fp8 weights (weight_dtype fp8, e4m3 per tensor from bf16 at load, activations per row): the
// projections, dense MLP and routed / shared experts go through CudaLinear's fp8 GEMMs, kv_b_proj,
// the router and the LM head stay bf16. The first step's logits of each prompt must stay near
// the bf16-weight model's: e4m3 keeps 3 mantissa bits (~2-4% rms rounding per element, weights
// and activations), compounding over 3 layers of up to 9 projections; a wrong scale, layout or
// expert index is off by O(1). The mean over the prompts is bounded as Llama's (0.2); one prompt
// may be further off (0.5) where fp8 rounding flips a router near-tie of its last row, which
// moves that row's hidden state by an expert's output. Then the same model decodes overlapped,
// with device sampling.
TEST_CASE("GPU DeepSeek fp8 weights track the bf16-weight model", "[gpu][deepseek][fp8]") {
  const auto prompts = Prompts();
  for (bool v3 : {false, true}) {
    const std::string name = v3 ? "v3_fp8w" : "v2_fp8w";
    const std::string dir = WriteRandomDeepseek(name, v3, nullptr);
    gpu_test::Logits ref, got;
    gpu_test::GenerateOptions o{.block_size = 64, .num_kv_blocks = 64, .steps = 4};
    o.logits = &ref;
    gpu_test::Generate(dir, prompts, o);
    o.logits = &got;
    o.weight_dtype = "fp8";
    gpu_test::Generate(dir, prompts, o);
    double mean = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const double rel = gpu_test::FirstStepDistance(ref, got, i);
      std::printf("%s prompt %zu: fp8 vs bf16 weights, relative L2 error of the logits %.4f\n",
                  name.c_str(), i, rel);
      INFO(name << " prompt " << i << ": relative L2 error " << rel);
      CHECK(rel < 0.5);
      mean += rel / static_cast<double>(prompts.size());
    }
    INFO(name << ": mean relative L2 error " << mean);
    CHECK(mean < 0.2);
    gpu_test::GenerateOptions f{.block_size = 64, .num_kv_blocks = 64, .steps = 16};
    f.weight_dtype = "fp8";
    const auto fast = gpu_test::Generate(dir, prompts, f);
    CHECK(fast.overlapped_steps >= 8);
    for (const auto& t : fast.tokens) CHECK(t.size() == 16);
    fs::remove_all(dir);
  }
}

// A DeepSeek-V3 block-fp8 checkpoint: the projections and the dense MLP run on the checkpoint's
// e4m3 bytes through cuBLASLt's 1x128 x 128x128 block-scaled GEMM, the routed and shared experts
// through the MoE layer's grouped GEMMs with the block scales (kv_b_proj dequantized by the
// loader); against the same checkpoint dequantized to bf16
// (weight_dtype bf16), first-step logits within the bounds of the test above (which also
// quantizes every weight).
TEST_CASE("GPU DeepSeek-V3 block-fp8 checkpoint tracks its dequantized model",
          "[gpu][deepseek][fp8]") {
  const auto prompts = Prompts();
  const std::string dir = WriteRandomDeepseek("v3_block_fp8", true, nullptr, /*dense_only=*/false,
                                              /*fp8_block=*/true);
  gpu_test::Logits ref, got;
  gpu_test::GenerateOptions o{.block_size = 64, .num_kv_blocks = 64, .steps = 4};
  o.logits = &ref;
  o.weight_dtype = "bf16";
  gpu_test::Generate(dir, prompts, o);
  o.logits = &got;
  o.weight_dtype = "auto";
  const auto fp8 = gpu_test::Generate(dir, prompts, o);
  double mean = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double rel = gpu_test::FirstStepDistance(ref, got, i);
    std::printf("v3 block fp8 prompt %zu: checkpoint fp8 vs dequantized, relative L2 %.4f\n", i,
                rel);
    INFO("prompt " << i << ": relative L2 error " << rel);
    CHECK(rel < 0.5);
    CHECK(fp8.tokens[i].size() == 4);
    mean += rel / static_cast<double>(prompts.size());
  }
  INFO("mean relative L2 error " << mean);
  CHECK(mean < 0.2);
  fs::remove_all(dir);
}

// Overlapped steps from the runner: step k + 1 is queued before step k's tokens reach the host,
// its fed-back ids read on the device. Scheduling does not depend on overlap, so the batches and
// their kernels are the same as one step at a time (device sampling in both): identical tokens.
TEST_CASE("GPU DeepSeek overlapped steps give the one-at-a-time tokens",
          "[gpu][deepseek][overlap]") {
  const std::string dir = WriteRandomDeepseek("v2_overlap", false, nullptr);
  const auto prompts = Prompts();
  gpu_test::GenerateOptions o{.block_size = 64, .num_kv_blocks = 64, .steps = 32};
  o.overlap = false;
  const auto one = gpu_test::Generate(dir, prompts, o);
  o.overlap = true;
  const auto over = gpu_test::Generate(dir, prompts, o);
  CHECK(one.overlapped_steps == 0);
  CHECK(over.overlapped_steps >= 16);
  CHECK(over.graph_steps > 0);  // the MoE layer never waits for the host: graphs and overlap
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK(over.tokens[i] == one.tokens[i]);
  }
  fs::remove_all(dir);
}

// Decode steps replayed from CUDA graphs against eager launches, with MoE layers (CudaMoeLayer
// routes on the device) and all-dense (first_k_dense_replace = num_layers). 13 requests
// of 1..40-token prompts asking for 64 - 4 i tokens: after the prefill the decode batch shrinks
// through buckets 16, 8, 4, 2 and 1, mostly with padding rows, and every bucket's graph replays
// steps of other sequence counts, contexts and block tables. Graph steps compute padded GEMMs,
// which may take other cuBLAS kernels (rounding, not math), so a divergence is accepted at a near-
// tie of the eager run only.
TEST_CASE("GPU DeepSeek decode steps replayed from CUDA graphs give the eager tokens",
          "[gpu][deepseek][graphs]") {
  std::mt19937 rng(9);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
  for (int i = 0; i < 13; ++i) {
    std::vector<int32_t> p(1 + rng() % 40);
    for (auto& t : p) t = static_cast<int32_t>(rng() % kVocab);
    prompts.push_back(p);
    max_tokens.push_back(kSteps - 4 * i);
  }
  struct Variant {
    bool v3;
    const char* kv;          // kv_cache_dtype
    const char* mla_kernel;  // ModelLoadOptions::mla_kernel
    bool dense;              // every layer dense
  };
  for (const Variant& v :
       {Variant{false, "auto", "auto", true}, Variant{true, "auto", "portable", true},
        Variant{false, "fp8_e4m3", "auto", true}, Variant{false, "auto", "auto", false},
        Variant{true, "auto", "auto", false}}) {
    const std::string what = std::string(v.v3 ? "v3" : "v2") + (v.dense ? " dense" : " moe") +
                             " kv=" + v.kv + " mla_kernel=" + v.mla_kernel;
    INFO(what);
    const std::string dir =
        WriteRandomDeepseek(std::string("graphs_") + (v.v3 ? "v3" : "v2") + (v.dense ? "d" : "m"),
                            v.v3, nullptr, v.dense);
    gpu_test::GenerateOptions o{.kv_dtype = v.kv,
                                .block_size = 64,
                                .num_kv_blocks = 64,
                                .mla_kernel = v.mla_kernel,
                                .max_tokens = &max_tokens};
    Gaps gaps;
    o.cuda_graph_max_batch = 0;
    o.gaps = &gaps;
    const auto eager = gpu_test::Generate(dir, prompts, o);
    o.gaps = nullptr;
    o.cuda_graph_max_batch = 256;
    const auto graphs = gpu_test::Generate(dir, prompts, o);  // captured at load (the default)
    o.graph_warmup = false;
    const auto lazy = gpu_test::Generate(dir, prompts, o);  // each on its bucket's first step
    CHECK(eager.graph_steps == 0);
    // About 60 decode-only steps (the longest request) minus, without the warm-up, one eager
    // step per bucket.
    CHECK(lazy.graph_steps >= 40);
    CHECK(graphs.graph_steps > lazy.graph_steps);
    for (const auto* run : {&graphs, &lazy}) {
      int identical = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const auto& ref = eager.tokens[i];
        const auto& got = run->tokens[i];
        REQUIRE(got.size() == ref.size());
        size_t k = 0;
        while (k < ref.size() && got[k] == ref[k]) ++k;
        if (k == ref.size()) {
          ++identical;
          continue;
        }
        const float gap = gaps.at(std::to_string(i)).at(k);
        std::printf("%s %s prompt %zu: first divergence at step %zu, eager top-2 gap %.2e\n",
                    what.c_str(), run == &graphs ? "graphs" : "lazy graphs", i, k, gap);
        INFO((run == &graphs ? "graphs" : "lazy graphs")
             << " prompt " << i << ": first divergence at step " << k << ", eager gap " << gap);
        CHECK(gap < kTieGap);
      }
      std::printf("%s %s: %d of %zu sequences identical to eager, %lld graph steps\n", what.c_str(),
                  run == &graphs ? "graphs" : "lazy graphs", identical, prompts.size(),
                  static_cast<long long>(run->graph_steps));
      CHECK(identical >= 10);
    }
    fs::remove_all(dir);
  }
}

// DeepSeek-V3 with a multi-token-prediction layer: WriteRandomDeepseek's last layer becomes the
// MTP layer's decoder layer (num_hidden_layers kLayers - 1, num_nextn_predict_layers 1), with its
// enorm, hnorm, eh_proj and shared_head.norm; embedding and head are the model's.
std::string WriteRandomDeepseekMtp(const std::string& name, bool dense_only) {
  const std::string dir = WriteRandomDeepseek(name, true, nullptr, dense_only);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  cfg["num_hidden_layers"] = kLayers - 1;
  cfg["num_nextn_predict_layers"] = 1;
  std::ofstream(dir + "/config.json") << cfg.dump();
  std::vector<TensorToWrite> ts;
  {
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    REQUIRE(file.ok());
    for (const auto& [n, t] : (*file)->tensors()) {
      ts.push_back({n, t.dtype, t.shape, std::vector<std::byte>(t.data, t.data + t.nbytes)});
    }
  }
  std::mt19937 rng(77);
  const std::string p = "model.layers." + std::to_string(kLayers - 1) + ".";
  const int64_t hidden = cfg["hidden_size"].get<int64_t>();
  for (const char* n : {"enorm", "hnorm", "shared_head.norm"}) {
    ts.push_back(RandomBf16Tensor(p + n + ".weight", {hidden}, 1, 0.1f, rng));
  }
  ts.push_back(RandomBf16Tensor(p + "eh_proj.weight", {hidden, 2 * hidden}, 0, 0.06f, rng));
  REQUIRE(WriteSafetensors(dir + "/model.safetensors", ts).ok());
  return dir;
}

// One sequence's rows at positions [from, from + tokens) in block 0 (block size 64).
ForwardBatch MtpRows(const std::vector<int32_t>& tokens, int from) {
  ForwardBatch b;
  AttentionBatch& a = b.attn;
  b.token_ids = tokens;
  for (int p = from; p < from + static_cast<int>(tokens.size()); ++p) {
    b.positions.push_back(p);
    a.slot_mapping.push_back(p);
  }
  a.num_seqs = 1;
  a.num_tokens = static_cast<int>(tokens.size());
  a.q_indptr = {0, a.num_tokens};
  a.kv_lens = {from + a.num_tokens};
  a.page_indices = {0};
  a.page_indptr = {0, 1};
  return b;
}

// The MTP layer on each device: the target over a prompt returns its hidden states (after the
// final norm), the MTP rows at positions 0 .. n-2 read the next token and those states, then a
// chained row at n-1 reads a token and the last row's output before the layer's final norm.
// [n, vocab] logits.
std::vector<float> MtpLogits(const std::string& dir, const std::string& device,
                             const std::vector<int32_t>& prompt) {
  ModelLoadOptions o;
  o.model_dir = dir;
  o.device = device;
  o.block_size = 64;
  o.num_kv_blocks = 4;
  o.cuda_graph_max_batch = 0;
  auto target = LoadModel(o);
  REQUIRE(target.ok());
  o.defer_kv_cache = true;
  auto mtp = LoadMtpModel(o);
  INFO(mtp.status().ToString());
  REQUIRE(mtp.ok());
  REQUIRE((*mtp)->AllocateKvCache(4).ok());
  const int n = static_cast<int>(prompt.size());
  const size_t H = (*target)->config().hidden_size;
  ForwardBatch t = MtpRows(prompt, 0);
  t.logit_rows = {n - 1};
  for (int r = 0; r < n; ++r) t.hidden_rows.push_back(r);
  std::vector<float> logits;
  REQUIRE((*target)->Forward(t, &logits).ok());
  REQUIRE((*target)->hidden_states().size() == n * H);
  ForwardBatch m = MtpRows(std::vector<int32_t>(prompt.begin() + 1, prompt.end()), 0);
  m.input_hidden.assign((*target)->hidden_states().begin(),
                        (*target)->hidden_states().begin() + (n - 1) * H);
  for (int r = 0; r < n - 1; ++r) m.logit_rows.push_back(r);
  m.hidden_rows = {n - 2};
  m.hidden_before_final_norm = true;
  std::vector<float> rows;
  REQUIRE((*mtp)->Forward(m, &rows).ok());
  ForwardBatch c = MtpRows({prompt[0]}, n - 1);
  c.input_hidden.assign((*mtp)->hidden_states().begin(), (*mtp)->hidden_states().end());
  c.logit_rows = {0};
  std::vector<float> chained;
  REQUIRE((*mtp)->Forward(c, &chained).ok());
  rows.insert(rows.end(), chained.begin(), chained.end());
  return rows;
}

// The CUDA MTP layer (cuda_deepseek_mtp) against the CPU one (cpu_deepseek_mtp, itself checked
// against mtp_reference.json): bf16 weights in both, bf16 activations on the GPU, so each row's
// logits agree to a few percent of the row's largest |logit|; a row whose MoE routing flipped at
// a near-tie may differ more, so 90% of the rows must.
TEST_CASE("GPU DeepSeek MTP layer matches the CPU MTP layer", "[gpu][deepseek][mtp]") {
  for (bool dense : {true, false}) {
    INFO((dense ? "dense MTP layer" : "MoE MTP layer"));
    const std::string dir = WriteRandomDeepseekMtp(dense ? "mtp_dense" : "mtp_moe", dense);
    std::mt19937 rng(11);
    std::vector<int32_t> prompt(40);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
    const std::vector<float> cpu = MtpLogits(dir, "cpu", prompt);
    const std::vector<float> gpu = MtpLogits(dir, "cuda", prompt);
    REQUIRE(cpu.size() == gpu.size());
    const size_t rows = cpu.size() / kVocab;
    int within = 0;
    double worst = 0;
    for (size_t r = 0; r < rows; ++r) {
      double scale = 0, err = 0;
      for (int v = 0; v < kVocab; ++v)
        scale = std::max(scale, std::abs(double(cpu[r * kVocab + v])));
      for (int v = 0; v < kVocab; ++v) {
        err = std::max(err, std::abs(double(gpu[r * kVocab + v]) - cpu[r * kVocab + v]));
      }
      worst = std::max(worst, err / scale);
      within += err < 0.05 * scale;
    }
    std::printf("MTP %s: %d of %zu rows within 5%% of max |logit|, worst %.3g\n",
                dense ? "dense" : "moe", within, rows, worst);
    CHECK(within >= 0.9 * static_cast<double>(rows));
    if (dense) CHECK(within == static_cast<int>(rows));
    fs::remove_all(dir);
  }
}

// --speculative-method mtp on the GPU: greedy tokens equal those without speculation up to
// near-ties (verify steps run other batch shapes; dense layers, so no router near-ties), and the
// layer drafts (its random weights make acceptance low, which costs nothing but speed).
TEST_CASE("GPU greedy decoding with the MTP layer gives the tokens without it",
          "[gpu][deepseek][mtp]") {
  const std::string dir = WriteRandomDeepseekMtp("mtp_spec", true);
  const auto prompts = Prompts();
  Gaps gaps;
  gpu_test::GenerateOptions o{.block_size = 64, .num_kv_blocks = 64, .steps = 32};
  o.gaps = &gaps;
  const auto plain = gpu_test::Generate(dir, prompts, o);
  o.gaps = nullptr;
  o.speculative_method = "mtp";
  for (int k : {1, 3}) {
    INFO("K = " << k);
    o.num_speculative_tokens = k;
    const auto spec = gpu_test::Generate(dir, prompts, o);
    std::printf("MTP K=%d: %lld of %lld drafts accepted\n", k,
                static_cast<long long>(spec.accepted_drafts),
                static_cast<long long>(spec.draft_tokens));
    CHECK(spec.draft_tokens > 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& ref = plain.tokens[i];
      const auto& got = spec.tokens[i];
      REQUIRE(got.size() == ref.size());
      size_t j = 0;
      while (j < ref.size() && got[j] == ref[j]) ++j;
      if (j == ref.size()) continue;
      const float gap = gaps.at(std::to_string(i)).at(j);
      INFO("prompt " << i << ": first divergence at step " << j << ", top-2 gap " << gap);
      CHECK(gap < kTieGap);
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llm
