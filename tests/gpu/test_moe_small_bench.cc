// One MoE layer of Qwen3-30B-A3B, DeepSeek-V2-Lite and gpt-oss-20b (MXFP4 experts) at decode
// batches of 1, 2, 4, 8 and 16 tokens in a CUDA graph, four ways: unfused (cuBLAS's router GEMM,
// LaunchMoeRoute, LaunchMoePermute, the tiled GEMMs, LaunchMoeCombine), the fused small-batch
// routing (LaunchMoeRouteFused), that plus the down GEMM's combine (MoeGemmArgs::combine), all
// with the tiled GEMMs, and the same with the expert GEMMs as GEMVs (LaunchMoeGemv: the layer's
// default at these batches), beside the layer's floor: the bytes it touches (the fp32 router and
// logit bias, the weights and biases of the experts the batch selects, the shared experts) over
// the copy rate measured in the same run. "x tiled" is the GEMV row's time over the tiled
// route+combine row's. Dummy weights; four layers run in turn so that the L2 does not hold the
// next layer's experts.
//
//   build/cuda/tests/gpu_tests "[.bench][moe_small]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "engine/layers/cuda/cuda_moe_layer.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_bench_util.h"
#include "tests/gpu/moe_routings.h"

namespace llm {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

TEST_CASE("MoE layer benchmark: decode batches, fused routing and combine, GEMVs against tiles",
          "[.bench][moe_small]") {
  gpu_test::BenchOps o;
  constexpr int kLayers = 4;
  struct Shape {
    const char* name;  // configs/models/<name>
    int E, K, H, I, SI;
    bool gpt_oss;  // router bias, softmax of the top-k, clamped SwiGLU, MXFP4 experts with biases
  };
  const double copy_rate = gpu_test::MeasureCopyRate(o.stream);
  std::printf("copy rate %.2f TB/s (read + write)\n", copy_rate / 1e12);
  std::printf("%-16s %5s %-20s %10s %10s %8s %10s %8s\n", "layer", "batch", "fused", "us/layer",
              "floor us", "x floor", "x unfused", "x tiled");
  for (const Shape sh : {Shape{"qwen3-30b-a3b", 128, 8, 2048, 768, 0, false},
                         Shape{"deepseek-v2-lite", 64, 6, 2048, 1408, 2 * 1408, false},
                         Shape{"gpt-oss-20b", 32, 4, 2880, 2880, 0, true}}) {
    MoeRouting r =
        sh.gpt_oss ? gpu_test::GptOssRouting(sh.E, sh.K) : gpu_test::GreedyRouting(sh.E, sh.K);
    r.normalize = sh.SI == 0 && !sh.gpt_oss;  // Qwen3 norm_topk_prob; V2-Lite none, scaling 1
    CpuMlp::Gate gate;
    if (sh.gpt_oss) {
      gate.activation = CpuMlp::Activation::kClampedSwiGlu;
      gate.swiglu_limit = 7.0f;
    }
    REQUIRE(CudaMoeLayer::Check(r, sh.H, sh.I, sh.SI, gate).ok());
    CudaMoeLayer layer(r, sh.H, sh.I, sh.SI, gate);
    if (sh.gpt_oss) layer.set_mxfp4(CudaMoeLayer::Mxfp4::kKeep);
    const MoeTensorNames names = sh.gpt_oss ? gpu_test::GptOssNames() : MoeTensorNames{};
    std::vector<CudaMoeWeights> w(kLayers);
    Bf16WeightLoader loader(nullptr, o.stream);
    for (int l = 0; l < kLayers; ++l) {
      REQUIRE(layer
                  .Load(loader, nullptr, o.ops, WeightQuant::kBf16,
                        "model.layers." + std::to_string(l) + ".mlp.", names, &w[l])
                  .ok());
      REQUIRE(w[l].mxfp4 == sh.gpt_oss);
    }
    // Bytes of one selected expert (MXFP4: values and scales as the kernels store them, k padded
    // to 128, plus the fp32 biases), of the shared experts and of the router.
    const double kp_h = cuda::MoeMxfp4KPad(sh.H), kp_i = cuda::MoeMxfp4KPad(sh.I);
    const double expert_bytes = sh.gpt_oss ? 2.0 * sh.I * (kp_h / 2 + kp_h / 32) +
                                                 1.0 * sh.H * (kp_i / 2 + kp_i / 32) +
                                                 (2.0 * sh.I + sh.H) * 4
                                           : 3.0 * sh.I * sh.H * 2;
    const double fixed_bytes =
        3.0 * sh.SI * sh.H * 2 + 4.0 * sh.E * sh.H + (sh.gpt_oss ? 4.0 * sh.E : 0.0);
    for (const int T : {1, 2, 4, 8, 16}) {
      DeviceBuffer d_x, d_out;
      REQUIRE(d_x.Alloc(static_cast<size_t>(T) * sh.H * 2).ok());
      REQUIRE(d_out.Alloc(static_cast<size_t>(T) * sh.H * 2 * kLayers).ok());
      std::mt19937 rng(T);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> x(static_cast<size_t>(T) * sh.H);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = F32ToBf16(nd(rng));
        x[i] = Bf16ToF32(xb[i]);  // the router reads the same values in fp32
      }
      CUDA_REQUIRE(cudaMemcpy(d_x.ptr, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      double unfused_us = 0, tiled_us = 0;
      // unfused; fused routing; and the GEMM's combine (tiled GEMMs); all that with the GEMVs
      for (const int mode : {0, 1, 2, 3}) {
        layer.set_fused_route_max_tokens(mode >= 1 ? cuda::kMoeRouteFusedMaxTokens : 0);
        layer.set_fused_combine_max_tokens(mode >= 2 ? cuda::kMoeFusedCombineMaxTokens : 0);
        layer.set_gemv_max_tokens(mode == 3 ? cuda::kMoeGemvMaxTokens : 0);
        REQUIRE(layer.UsesFusedRoute(T) == (mode >= 1));
        REQUIRE(layer.UsesFusedCombine(T) == (mode >= 2));
        const bool gemv = layer.UsesGemv(T, w[0]);
        REQUIRE(gemv == (mode == 3 && cuda::MoeGemvBatchOk(T, sh.K, sh.E)));
        if (mode == 3 && !gemv) continue;  // the tiled row above is the layer's choice
        std::vector<CudaMoeScratch> s(kLayers);
        for (int l = 0; l < kLayers; ++l) {
          REQUIRE(layer.Reserve(T, &s[l]).ok());
          CUDA_REQUIRE(cudaMemcpy(s[l].x_f32.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        }
        auto run_all = [&] {
          for (int l = 0; l < kLayers; ++l) {
            REQUIRE(layer
                        .Run(o.ops, w[l], d_x.ptr, T, &s[l],
                             d_out.as<uint16_t>() + static_cast<size_t>(l) * T * sh.H, {})
                        .ok());
          }
        };
        run_all();
        CUDA_REQUIRE(cudaStreamSynchronize(o.stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_REQUIRE(cudaStreamBeginCapture(o.stream, cudaStreamCaptureModeThreadLocal));
        run_all();
        CUDA_REQUIRE(cudaStreamEndCapture(o.stream, &graph));
        CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
        const double us = gpu_test::MedianGraphUs(exec, o.stream) / kLayers;
        double touched = 0;  // experts per layer, from the routing the graph computed
        for (int l = 0; l < kLayers; ++l) {
          const std::vector<int32_t> ids = cuda::Download(s[l].topk_ids.as<int32_t>(), T * sh.K);
          std::vector<char> used(sh.E, 0);
          for (int32_t id : ids) used[id] = 1;
          touched += std::count(used.begin(), used.end(), 1);
        }
        touched /= kLayers;
        const double floor_us = (touched * expert_bytes + fixed_bytes) / copy_rate * 1e6;
        if (mode == 0) unfused_us = us;
        if (mode == 2) tiled_us = us;
        const char* names[] = {"unfused", "route", "route+combine", "route+combine+gemv"};
        char vs_tiled[16] = "-";
        if (mode == 3) std::snprintf(vs_tiled, sizeof(vs_tiled), "%.2f", us / tiled_us);
        std::printf("%-16s %5d %-20s %10.1f %10.1f %8.2f %10.2f %8s\n", sh.name, T, names[mode], us,
                    floor_us, us / floor_us, us / unfused_us, vs_tiled);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
    }
  }
}

}  // namespace
}  // namespace llm
