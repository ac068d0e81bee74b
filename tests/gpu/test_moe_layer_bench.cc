// MoE layer benchmarks with bf16 and fp8 experts (engine/layers/cuda/cuda_moe_layer.h): a
// DeepSeek-V2-Lite layer at decode batches in a CUDA graph against its floor, and prefill-sized
// batches through the tiles and cuBLAS's grouped and per-expert GEMMs. Hidden from plain runs:
//
//   build/.../tests/gpu_tests "[.bench][moe]"
//   build/.../tests/gpu_tests "[.bench][moe_prefill]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "engine/layers/cuda/cuda_moe_layer.h"
#include "engine/layers/moe_router.h"
#include "tests/gpu/copy_rate.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_bench_util.h"
#include "tests/gpu/moe_layer_ops.h"
#include "tests/gpu/moe_routings.h"

namespace llm {
namespace {

using cuda::Download;
using gpu_test::GreedyRouting;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

float RoundBf16(float x) {
  return Bf16ToF32(F32ToBf16(x));
}

// One DeepSeek-V2-Lite MoE layer (64 experts, top-6, 2 shared, hidden 2048, moe_intermediate
// 1408; dummy weights) in a CUDA graph at batch 1 / 64 / 128, beside its floor: the bytes of the
// routed experts the batch touches (plus the shared experts and the fp32 router) over the copy
// rate measured in the same run.
// Four layers' weights (4.6 GB bf16) run in turn so the L2 holds none of them.
//   gpu_tests "[.bench][moe]"
TEST_CASE("MoE layer benchmark: DeepSeek-V2-Lite shapes in a CUDA graph", "[.bench][moe]") {
  gpu_test::MoeLayerOps o;
  const double copy_rate = gpu_test::MeasureCopyRate(o.stream);
  std::printf("copy rate %.2f TB/s (read + write)\n", copy_rate / 1e12);
  constexpr int kLayers = 4, E = 64, K = 6, H = 2048, I = 1408, SI = 2 * 1408;
  MoeRouting r = GreedyRouting(E, K);
  r.normalize = false;  // V2-Lite: norm_topk_prob false, routed_scaling_factor 1
  const CudaMoeLayer layer(r, H, I, SI);
  REQUIRE(CudaMoeLayer::Check(r, H, I, SI).ok());
  std::printf("%-6s %-5s %10s %12s %12s %8s %s\n", "weight", "batch", "us/layer", "routed floor",
              "+shared", "x floor", "(anchor: torch._grouped_mm 123 us @1, 491 us @128)");
  for (const WeightQuant quant : {WeightQuant::kBf16, WeightQuant::kFp8PerTensor}) {
    const double wbytes = quant == WeightQuant::kBf16 ? 2.0 : 1.0;
    std::vector<CudaMoeWeights> w(kLayers);
    Bf16WeightLoader loader(nullptr, o.stream);
    for (int l = 0; l < kLayers; ++l) {
      REQUIRE(layer
                  .Load(loader, nullptr, o.ops, quant,
                        "model.layers." + std::to_string(l) + ".mlp.", MoeTensorNames{}, &w[l])
                  .ok());
    }
    for (const int T : {1, 64, 128}) {
      std::vector<CudaMoeScratch> s(kLayers);
      DeviceBuffer d_x, d_out;
      REQUIRE(d_x.Alloc(static_cast<size_t>(T) * H * 2).ok());
      REQUIRE(d_out.Alloc(static_cast<size_t>(T) * H * 2 * kLayers).ok());
      std::mt19937 rng(T);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> x(static_cast<size_t>(T) * H);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = F32ToBf16(x[i] = RoundBf16(nd(rng)));
      CUDA_REQUIRE(cudaMemcpy(d_x.ptr, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      for (int l = 0; l < kLayers; ++l) {
        REQUIRE(layer.Reserve(T, &s[l]).ok());
        CUDA_REQUIRE(cudaMemcpy(s[l].x_f32.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
      }
      auto run_all = [&] {
        for (int l = 0; l < kLayers; ++l) {
          REQUIRE(layer
                      .Run(o.ops, w[l], d_x.ptr, T, &s[l],
                           d_out.as<uint16_t>() + static_cast<size_t>(l) * T * H, {})
                      .ok());
        }
      };
      const double us_per_layer = gpu_test::MedianCapturedUs(o.stream, run_all) / kLayers;
      // Touched experts per layer, from the routing the graph computed.
      double routed_bytes = 0;
      for (int l = 0; l < kLayers; ++l) {
        const std::vector<int32_t> ids = Download(s[l].topk_ids.as<int32_t>(), T * K);
        std::vector<char> used(E, 0);
        for (int32_t id : ids) used[id] = 1;
        routed_bytes += std::count(used.begin(), used.end(), 1) * 3.0 * I * H * wbytes;
      }
      routed_bytes /= kLayers;
      const double other = 3.0 * SI * H * wbytes + 4.0 * E * H;
      const double floor_us = routed_bytes / copy_rate * 1e6,
                   all_us = (routed_bytes + other) / copy_rate * 1e6;
      std::printf("%-6s %-5d %10.1f %12.1f %12.1f %8.2f\n",
                  quant == WeightQuant::kBf16 ? "bf16" : "fp8", T, us_per_layer, floor_us, all_us,
                  us_per_layer / all_us);
    }
  }
}

// Prefill-sized batches through both expert-GEMM paths, eager (the large-batch path waits for
// the host once per layer and is never captured): DeepSeek-V2-Lite's layer (64 experts, top-6,
// 2 shared) and Qwen3-30B-A3B's (128 experts, top-8, intermediate 768, no shared experts), bf16,
// dummy weights. FLOPs = 2 x (slots x 3 I H + tokens x 3 SI H).
//   gpu_tests "[.bench][moe_prefill]"
TEST_CASE("MoE layer benchmark: prefill-sized batches, tiles against cuBLAS (grouped, per expert)",
          "[.bench][moe_prefill]") {
  gpu_test::MoeLayerOps o;
  struct Shape {
    const char* name;
    int E, K, H, I, SI;
  };
  std::printf("%-14s %-6s %-7s %10s %9s\n", "layer", "batch", "path", "us/layer", "TFLOP/s");
  for (const Shape sh : {Shape{"v2-lite", 64, 6, 2048, 1408, 2 * 1408},
                         Shape{"qwen3-30b-a3b", 128, 8, 2048, 768, 0}}) {
    MoeRouting r = GreedyRouting(sh.E, sh.K);
    r.normalize = sh.SI == 0;
    REQUIRE(CudaMoeLayer::Check(r, sh.H, sh.I, sh.SI).ok());
    CudaMoeLayer tiled(r, sh.H, sh.I, sh.SI), large(r, sh.H, sh.I, sh.SI),
        loop(r, sh.H, sh.I, sh.SI);
    tiled.set_large_batch_slots_per_expert(INT_MAX);
    large.set_large_batch_gemm(CudaMoeLayer::LargeBatchGemm::kGrouped);
    loop.set_large_batch_gemm(CudaMoeLayer::LargeBatchGemm::kPerExpert);
    CudaMoeLayer automatic(r, sh.H, sh.I, sh.SI);  // the default choice
    CudaMoeWeights w;
    Bf16WeightLoader loader(nullptr, o.stream);
    REQUIRE(large
                .Load(loader, nullptr, o.ops, WeightQuant::kBf16, "model.layers.0.mlp.",
                      MoeTensorNames{}, &w)
                .ok());
    for (const int T : {1024, 8192}) {
      DeviceBuffer d_x, d_out;
      REQUIRE(d_x.Alloc(static_cast<size_t>(T) * sh.H * 2).ok());
      REQUIRE(d_out.Alloc(static_cast<size_t>(T) * sh.H * 2).ok());
      std::mt19937 rng(T);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> x(static_cast<size_t>(T) * sh.H);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = F32ToBf16(x[i] = RoundBf16(nd(rng)));
      CUDA_REQUIRE(cudaMemcpy(d_x.ptr, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      const double flops =
          2.0 * (double(T) * sh.K * 3 * sh.I * sh.H + double(T) * 3 * sh.SI * sh.H);
      for (const CudaMoeLayer* layer : {&tiled, &large, &loop, &automatic}) {
        CudaMoeScratch s;
        REQUIRE(layer->Reserve(T, &s).ok());
        CUDA_REQUIRE(cudaMemcpy(s.x_f32.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        REQUIRE(layer->TakesLargeBatchPath(T, w) == (layer != &tiled));
        for (int i = 0; i < 3; ++i)
          REQUIRE(layer->Run(o.ops, w, d_x.ptr, T, &s, d_out.ptr, {}).ok());
        cudaEvent_t e0, e1;
        CUDA_REQUIRE(cudaEventCreate(&e0));
        CUDA_REQUIRE(cudaEventCreate(&e1));
        std::vector<float> us;
        for (int rep = 0; rep < 9; ++rep) {
          CUDA_REQUIRE(cudaEventRecord(e0, o.stream));
          REQUIRE(layer->Run(o.ops, w, d_x.ptr, T, &s, d_out.ptr, {}).ok());
          CUDA_REQUIRE(cudaEventRecord(e1, o.stream));
          CUDA_REQUIRE(cudaEventSynchronize(e1));
          float ms = 0;
          CUDA_REQUIRE(cudaEventElapsedTime(&ms, e0, e1));
          us.push_back(ms * 1000.f);
        }
        std::sort(us.begin(), us.end());
        const double med = us[us.size() / 2];
        std::printf("%-14s %-6d %-7s %10.1f %9.1f\n", sh.name, T,
                    layer == &tiled   ? "tiles"
                    : layer == &large ? "grouped"
                    : layer == &loop  ? "per-exp"
                                      : "auto",
                    med, flops / (med * 1e-6) / 1e12);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
      }
    }
  }
}

}  // namespace
}  // namespace llm
