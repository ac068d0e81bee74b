// The dense architectures beyond Llama / Qwen2 on the CUDA runner against the CPU decoder (the
// oracle computes the same DecoderSpec): greedy tokens over 64 steps for random tiny models, on
// each CUDA attention backend that serves them, and decode steps from CUDA graphs against eager
// ones. Qwen3: per-head q/k RMSNorm before rotary (the norm precedes the KV append, so the
// backend's fused rotary is bypassed for it). Gemma 2 / 3: (1 + w) norms, the post-branch norms,
// GeGLU, the embedding scale, soft-caps and sliding / global layers.
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/model.h"
#include "tests/gpu/engine_generate.h"
#include "tests/gpu/random_llama.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using gpu_test::Gaps;

std::vector<std::vector<int32_t>> ArchPrompts() {
  return gpu_test::RandomPrompts(13);
}

// Identical until a step where the reference's top-2 gap (of max |logit|) is a near-tie; at least
// min_identical of the sequences identical throughout (test_cuda_model.cc's rule).
void CheckSameUpToTies(const std::string& what, const std::vector<std::vector<int32_t>>& ref,
                       const Gaps& gaps, const std::vector<std::vector<int32_t>>& got,
                       double min_identical) {
  int identical = 0;
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(got[i].size() == ref[i].size());
    size_t k = 0;
    while (k < ref[i].size() && got[i][k] == ref[i][k]) ++k;
    if (k == ref[i].size()) {
      ++identical;
      continue;
    }
    const float gap = gaps.at(std::to_string(i)).at(k);
    INFO(what << " prompt " << i << ": first divergence at step " << k << ", reference top-2 gap "
              << gap);
    CHECK(gap < (k >= 16 ? 1e-2f : 5e-3f));
  }
  INFO(what << ": " << identical << " of " << ref.size() << " identical");
  CHECK(identical >= min_identical * static_cast<double>(ref.size()));
}

TEST_CASE("GPU Qwen3 (q/k norm) matches the CPU decoder over 64 greedy steps",
          "[gpu][model][archs]") {
  for (int head_dim : {64, 128}) {
    const std::string dir = gpu_test::WriteRandomDense("qwen3_d" + std::to_string(head_dim),
                                                       gpu_test::RandomArch::kQwen3, head_dim);
    Gaps gaps;
    const auto cpu = gpu_test::Generate(dir, ArchPrompts(), {.device = "cpu", .gaps = &gaps});
    for (const std::string backend : {"cuda_c8", "cuda_fmha"}) {
      const std::string what = "qwen3 head_dim " + std::to_string(head_dim) + " " + backend;
      INFO(what);
      const auto eager = gpu_test::Generate(dir, ArchPrompts(),
                                            {.force_backend = backend, .cuda_graph_max_batch = 0});
      CHECK(eager.backend == backend);
      CheckSameUpToTies(what + " eager", cpu.tokens, gaps, eager.tokens, 0.5);
      const auto graphs = gpu_test::Generate(dir, ArchPrompts(), {.force_backend = backend});
      CHECK(graphs.graph_steps >= 40);
      CheckSameUpToTies(what + " graphs", cpu.tokens, gaps, graphs.tokens, 0.5);
    }
    fs::remove_all(dir);
  }
}

// Gemma 2 / 3 at head_dim 128 and at the real models' 256: sliding and global layers, soft-caps
// (Gemma 2), per-layer rope theta and q/k norms (Gemma 3). cuda_c8 has no soft-cap or head_dim
// 256, so selection picks cuda_fmha for Gemma 2 and at head_dim 256; Gemma 3 at head_dim 128 (its
// windows, no soft-cap) gets cuda_c8.
TEST_CASE("GPU Gemma 2 and 3 match the CPU decoder over 64 greedy steps", "[gpu][model][archs]") {
  for (const int head_dim : {128, 256}) {
    for (const auto arch : {gpu_test::RandomArch::kGemma2, gpu_test::RandomArch::kGemma3}) {
      const std::string what =
          std::string(arch == gpu_test::RandomArch::kGemma2 ? "gemma2" : "gemma3") + "_d" +
          std::to_string(head_dim);
      INFO(what);
      const std::string dir = gpu_test::WriteRandomDense(what, arch, head_dim);
      Gaps gaps;
      const auto cpu = gpu_test::Generate(dir, ArchPrompts(), {.device = "cpu", .gaps = &gaps});
      // The random Gemma 3 model at head_dim 256 has near-flat logits: every prompt may diverge,
      // each at a near-tie (test_cuda_arch_logits.cc measures its logits: as close to
      // the CPU's as the other architectures'), so only the per-divergence check applies there.
      const double min_identical =
          arch == gpu_test::RandomArch::kGemma3 && head_dim == 256 ? 0.0 : 0.5;
      const auto eager = gpu_test::Generate(dir, ArchPrompts(), {.cuda_graph_max_batch = 0});
      CHECK(eager.backend == (arch == gpu_test::RandomArch::kGemma3 && head_dim == 128 &&
                                      gpu_test::CudaC8ServesWindows()
                                  ? "cuda_c8"
                                  : "cuda_fmha"));
      CheckSameUpToTies(what + " eager", cpu.tokens, gaps, eager.tokens, min_identical);
      const auto graphs = gpu_test::Generate(dir, ArchPrompts(), {});
      CHECK(graphs.graph_steps >= 40);
      CheckSameUpToTies(what + " graphs", cpu.tokens, gaps, graphs.tokens, min_identical);
      fs::remove_all(dir);
    }
  }
}

}  // namespace
}  // namespace llm
