// The MoE layer with MXFP4 experts (CudaMoeLayer::Mxfp4::kKeep, dummy weights): a batch whose
// tiles are 16, 32 or 64 rows (MoeMxfp4TileRows), captured in a CUDA graph, gives every token the
// output that token gets alone (batch 1: 16-row tiles of one row), which checks that the layer
// cuts the tiles and runs the GEMMs at the same size (the GEMMs themselves are checked against
// the CPU in test_moe_mxfp4.cc); and the benchmark of gpt-oss-20b's layer against bf16 experts
// and its floor (the bytes of the touched experts over the copy rate measured in the same run).
//
//   build/cuda/tests/gpu_tests "[mxfp4]"
//   build/cuda/tests/gpu_tests "[.bench][moe_mxfp4]"
#include <catch2/catch.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "engine/layers/cuda/cuda_moe_layer.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "tests/gpu/copy_rate.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_bench_util.h"

namespace llm {
namespace {

using cuda::Download;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

using gpu_test::BenchOps;
using gpu_test::GptOssNames;
using gpu_test::MeasureCopyRate;

TEST_CASE("MoE layer with MXFP4 experts: a graphed batch gives each token its batch-1 output",
          "[gpu][moe][mxfp4]") {
  BenchOps o;
  const int E = 8, K = 4, H = 256, I = 192;
  MoeRouting r;
  r.num_experts = E;
  r.top_k = K;
  r.scoring = MoeRouting::Scoring::kSoftmaxOfTopK;
  CpuMlp::Gate gate;
  gate.activation = CpuMlp::Activation::kClampedSwiGlu;
  gate.swiglu_limit = 7.0f;
  REQUIRE(CudaMoeLayer::Check(r, H, I, 0, gate).ok());
  CudaMoeLayer layer(r, H, I, 0, gate);
  layer.set_gemv_max_tokens(cuda::kMoeGemvMaxTokens);  // the GEMVs up to batch 8 here
  layer.set_mxfp4(CudaMoeLayer::Mxfp4::kKeep);
  CudaMoeWeights w;
  Bf16WeightLoader loader(nullptr, o.stream);
  REQUIRE(layer
              .Load(loader, nullptr, o.ops, WeightQuant::kBf16, "model.layers.0.mlp.",
                    GptOssNames(), &w)
              .ok());
  REQUIRE(w.mxfp4);
  std::set<int> tile_sizes;
  for (const int T : {1, 8, 40, 100}) {  // tiles of 16, 16, 32, 64 rows
    INFO("T " << T);
    tile_sizes.insert(cuda::MoeMxfp4TileRows(T, K, E));
    std::mt19937 rng(T);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> xb(static_cast<size_t>(T) * H);
    std::vector<float> x(xb.size());
    for (size_t i = 0; i < xb.size(); ++i) {
      xb[i] = F32ToBf16(nd(rng));
      x[i] = Bf16ToF32(xb[i]);
    }
    CudaMoeScratch s;
    REQUIRE(layer.Reserve(T, &s).ok());
    DeviceBuffer d_x, d_out;
    REQUIRE(d_x.Alloc(xb.size() * 2).ok());
    REQUIRE(d_out.Alloc(xb.size() * 2).ok());
    CUDA_REQUIRE(cudaMemcpy(d_x.ptr, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemcpy(s.x_f32.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemset(d_out.ptr, 0xff, xb.size() * 2));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_REQUIRE(cudaStreamBeginCapture(o.stream, cudaStreamCaptureModeThreadLocal));
    REQUIRE(layer.Run(o.ops, w, d_x.ptr, T, &s, d_out.ptr, {}).ok());
    CUDA_REQUIRE(cudaStreamEndCapture(o.stream, &graph));
    CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_REQUIRE(cudaGraphLaunch(exec, o.stream));
    CUDA_REQUIRE(cudaStreamSynchronize(o.stream));
    const std::vector<uint16_t> batch = Download(d_out.as<uint16_t>(), xb.size());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    {  // the down GEMM's combine (small batches) against LaunchMoeCombine: the same bits
      CudaMoeLayer separate = layer;
      separate.set_fused_combine_max_tokens(0);
      CHECK(layer.UsesFusedCombine(T) == (T <= cuda::kMoeFusedCombineMaxTokens));
      REQUIRE(separate.Run(o.ops, w, d_x.ptr, T, &s, d_out.ptr, {}).ok());
      CUDA_REQUIRE(cudaStreamSynchronize(o.stream));
      REQUIRE(Download(d_out.as<uint16_t>(), xb.size()) == batch);
    }
    // Each token alone through the routing the batch took: the fused kernel's logits (batches
    // up to kMoeRouteFusedMaxTokens) are not cuBLAS's bits, and a near-tie could go either way.
    // Likewise the expert GEMMs: the GEMVs (batches up to 8 here: 32 slots over 8 experts) or
    // the tiled GEMMs for both, so that only the tile sizes differ.
    CudaMoeLayer alone = layer;
    if (!layer.UsesFusedRoute(T)) alone.set_fused_route_max_tokens(0);
    REQUIRE(alone.UsesFusedRoute(1) == layer.UsesFusedRoute(T));
    CHECK(layer.UsesGemv(T, w) == (T <= 8));
    if (!layer.UsesGemv(T, w)) alone.set_gemv_max_tokens(0);
    REQUIRE(alone.UsesGemv(1, w) == layer.UsesGemv(T, w));
    CudaMoeScratch one;
    REQUIRE(alone.Reserve(1, &one).ok());
    DeviceBuffer d_out1;
    REQUIRE(d_out1.Alloc(H * 2).ok());
    double rms = 0;
    for (uint16_t v : batch) rms += static_cast<double>(Bf16ToF32(v)) * Bf16ToF32(v);
    rms = std::sqrt(rms / batch.size());
    REQUIRE(rms > 0);  // NaN fails too
    for (int t = 0; t < T; ++t) {
      CUDA_REQUIRE(cudaMemcpy(one.x_f32.ptr, x.data() + static_cast<size_t>(t) * H, H * 4,
                              cudaMemcpyHostToDevice));
      REQUIRE(alone
                  .Run(o.ops, w, d_x.as<uint16_t>() + static_cast<size_t>(t) * H, 1, &one,
                       d_out1.ptr, {})
                  .ok());
      const std::vector<uint16_t> alone = Download(d_out1.as<uint16_t>(), H);
      for (int n = 0; n < H; ++n) {
        const float a = Bf16ToF32(alone[n]), b = Bf16ToF32(batch[static_cast<size_t>(t) * H + n]);
        INFO("token " << t << " n " << n << ": batch " << b << " alone " << a);
        // The same products summed in the same k order: equal up to the mma's internal rounding.
        REQUIRE(std::fabs(a - b) <= 1e-2 * std::fabs(a) + 1e-3 * rms);
      }
    }
  }
  CHECK(tile_sizes == std::set<int>{16, 32, 64});
}

// gpt-oss-20b's MoE layer (32 experts, top-4, hidden 2880, expert intermediate 2880, router and
// expert biases, clamped SwiGLU; dummy weights) in a CUDA graph at T = 1, 8, 64, 256 tokens, its
// experts MXFP4 (the MXFP4 grouped GEMMs, CudaMoeLayer::Mxfp4::kKeep) and bf16 (the same layer
// dequantized) in the same run, beside the floor: the bytes of the experts the batch touches
// (MXFP4: the values and scales as the kernels store them, k padded to 128; bf16: 2 bytes a
// weight) and their biases, plus the fp32 router, over the copy rate measured in the same run.
// Two layers' weights run in turn (one MXFP4 layer, 0.43 GB, already exceeds the L2).
//   gpu_tests "[.bench][moe_mxfp4]"
TEST_CASE("MoE layer benchmark: gpt-oss-20b shapes, MXFP4 against bf16 experts",
          "[.bench][moe_mxfp4]") {
  BenchOps o;
  constexpr int kLayers = 2, E = 32, K = 4, H = 2880, I = 2880;
  MoeRouting r;
  r.num_experts = E;
  r.top_k = K;
  r.scoring = MoeRouting::Scoring::kSoftmaxOfTopK;
  CpuMlp::Gate gate;
  gate.activation = CpuMlp::Activation::kClampedSwiGlu;
  gate.swiglu_limit = 7.0f;
  const MoeTensorNames names = GptOssNames();
  REQUIRE(CudaMoeLayer::Check(r, H, I, 0, gate).ok());
  const double copy_rate = MeasureCopyRate(o.stream);
  std::printf("copy rate %.2f TB/s (read + write)\n", copy_rate / 1e12);
  std::printf("%-6s %-5s %5s %10s %10s %8s %10s\n", "expert", "batch", "tile", "us/layer",
              "floor us", "x floor", "x bf16");
  const double kp_h = cuda::MoeMxfp4KPad(H), kp_i = cuda::MoeMxfp4KPad(I);
  const double mx_expert_bytes =
      2.0 * I * (kp_h / 2 + kp_h / 32) + 1.0 * H * (kp_i / 2 + kp_i / 32) + (2.0 * I + H) * 4;
  const double bf16_expert_bytes = 3.0 * I * H * 2 + (2.0 * I + H) * 4;
  const std::vector<int> batches = {1, 8, 64, 256};
  std::vector<double> bf16_us(batches.size(), 0.0);
  for (const bool mx : {false, true}) {
    CudaMoeLayer layer(r, H, I, 0, gate);
    layer.set_mxfp4(mx ? CudaMoeLayer::Mxfp4::kKeep : CudaMoeLayer::Mxfp4::kDequantize);
    std::vector<CudaMoeWeights> w(kLayers);
    Bf16WeightLoader loader(nullptr, o.stream);
    for (int l = 0; l < kLayers; ++l) {
      REQUIRE(layer
                  .Load(loader, nullptr, o.ops, WeightQuant::kBf16,
                        "model.layers." + std::to_string(l) + ".mlp.", names, &w[l])
                  .ok());
      REQUIRE(w[l].mxfp4 == mx);
    }
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const int T = batches[bi];
      std::vector<CudaMoeScratch> s(kLayers);
      DeviceBuffer d_x, d_out;
      REQUIRE(d_x.Alloc(static_cast<size_t>(T) * H * 2).ok());
      REQUIRE(d_out.Alloc(static_cast<size_t>(T) * H * 2 * kLayers).ok());
      std::mt19937 rng(T);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> x(static_cast<size_t>(T) * H);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = F32ToBf16(nd(rng));
        x[i] = Bf16ToF32(xb[i]);  // the router reads the same values in fp32
      }
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
      const double us = gpu_test::MedianCapturedUs(o.stream, run_all) / kLayers;
      double touched = 0;  // experts per layer, from the routing the graph computed
      for (int l = 0; l < kLayers; ++l) {
        const std::vector<int32_t> ids = Download(s[l].topk_ids.as<int32_t>(), T * K);
        std::vector<char> used(E, 0);
        for (int32_t id : ids) used[id] = 1;
        touched += std::count(used.begin(), used.end(), 1);
      }
      touched /= kLayers;
      const double bytes =
          touched * (mx ? mx_expert_bytes : bf16_expert_bytes) + 4.0 * E * H + 4.0 * E;
      const double floor_us = bytes / copy_rate * 1e6;
      if (!mx) bf16_us[bi] = us;
      std::printf("%-6s %-5d %5d %10.1f %10.1f %8.2f %10.2f\n", mx ? "mxfp4" : "bf16", T,
                  mx ? cuda::MoeMxfp4TileRows(T, K, E) : cuda::kMoeTileRows, us, floor_us,
                  us / floor_us, mx ? us / bf16_us[bi] : 1.0);
    }
  }
}

}  // namespace
}  // namespace llm
