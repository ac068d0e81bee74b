// The first step's logits of every CUDA architecture against the CPU decoder on the same random
// tiny model (both follow the same prompt, so nothing has diverged yet): relative L2 error of the
// logits, and for MoE models how many (position, layer) routing decisions of the prompts differ.
// Greedy-token tests only see an error where it flips a token; this measures it at every step 0.
// The bound is loose (bf16 weights and activations against fp32); the printed table is the
// comparison between architectures.
//
//   build/.../tests/gpu_tests "[arch_logits]"
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/engine_generate.h"
#include "tests/gpu/random_llama.h"
#include "tests/gpu/random_moe.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<int32_t>> Prompts() {
  return gpu_test::RandomPrompts(17);
}

// Decisions present in both runs whose expert sets differ.
int RoutingMismatches(const gpu_test::Routing& a, const gpu_test::Routing& b, int* total) {
  int bad = 0;
  for (const auto& [req, decisions] : a) {
    const auto it = b.find(req);
    if (it == b.end()) continue;
    for (const auto& [key, d] : decisions) {
      const auto jt = it->second.find(key);
      if (jt == it->second.end()) continue;
      ++*total;
      if (jt->second.experts != d.experts) ++bad;
    }
  }
  return bad;
}

TEST_CASE("GPU first-step logits of every architecture track the CPU decoder",
          "[gpu][archs][arch_logits]") {
  struct Model {
    std::string name;
    std::string dir;
    bool moe;
  };
  std::vector<Model> models = {
      {"llama_d128", gpu_test::WriteRandomDense("lg_llama", gpu_test::RandomArch::kLlama, 128),
       false},
      {"qwen3_d128", gpu_test::WriteRandomDense("lg_qwen3", gpu_test::RandomArch::kQwen3, 128),
       false},
      {"gemma2_d256", gpu_test::WriteRandomDense("lg_gemma2", gpu_test::RandomArch::kGemma2, 256),
       false},
      {"gemma3_d128", gpu_test::WriteRandomDense("lg_gemma3a", gpu_test::RandomArch::kGemma3, 128),
       false},
      {"gemma3_d256", gpu_test::WriteRandomDense("lg_gemma3b", gpu_test::RandomArch::kGemma3, 256),
       false},
      {"mixtral", gpu_test::WriteRandomMoe("lg_mixtral", gpu_test::RandomMoeArch::kMixtral), true},
      {"qwen3_moe", gpu_test::WriteRandomMoe("lg_qwen3moe", gpu_test::RandomMoeArch::kQwen3Moe),
       true},
      {"gpt_oss", gpu_test::WriteRandomMoe("lg_gptoss", gpu_test::RandomMoeArch::kGptOss), true},
  };
  for (const Model& m : models) {
    INFO(m.name);
    gpu_test::Logits cpu_logits, gpu_logits;
    gpu_test::Routing cpu_routing, gpu_routing;
    gpu_test::GenerateOptions c{.device = "cpu", .steps = 1, .logits = &cpu_logits};
    gpu_test::GenerateOptions g{.cuda_graph_max_batch = 0, .steps = 1, .logits = &gpu_logits};
    if (m.moe) {
      c.routing = &cpu_routing;
      g.routing = &gpu_routing;
    }
    gpu_test::Generate(m.dir, Prompts(), c);
    gpu_test::Generate(m.dir, Prompts(), g);
    double worst = 0;
    for (size_t i = 0; i < Prompts().size(); ++i) {
      worst = std::max(worst, gpu_test::FirstStepDistance(cpu_logits, gpu_logits, i));
    }
    int total = 0;
    const int bad = m.moe ? RoutingMismatches(cpu_routing, gpu_routing, &total) : 0;
    std::printf("arch_logits %-12s worst first-step relative L2 %.4f, routing %d of %d differ\n",
                m.name.c_str(), worst, bad, total);
    CHECK(worst < 0.1);
    CHECK(bad <= total / 50);
    fs::remove_all(m.dir);
  }
}

}  // namespace
}  // namespace llm
