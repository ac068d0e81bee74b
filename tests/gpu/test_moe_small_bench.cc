// One MoE layer of Qwen3-30B-A3B, DeepSeek-V2-Lite and gpt-oss-20b (MXFP4 experts) at decode
// batches of 1, 2, 4, 8 and 16 tokens in a CUDA graph, four ways: unfused (cuBLAS's router GEMM,
// LaunchMoeRoute, LaunchMoePermute, the tiled GEMMs, LaunchMoeCombine), the fused small-batch
// routing (LaunchMoeRouteFused), that plus the down GEMM's combine (MoeGemmArgs::combine), all
// with the tiled GEMMs, and the same with the expert GEMMs as GEMVs (LaunchMoeGemv: the layer's
// default at these batches), beside the layer's floor: the bytes it touches (the fp32 router and
// logit bias, the weights and biases of the experts the batch selects, the shared experts) over
// the copy rate measured in the same run. "x tiled" is the GEMV row's time over the tiled
// route+combine row's. Dummy weights; four layers run in turn so that the L2 does not hold the
// next layer's experts. The second benchmark times the expert GEMMs alone, GEMVs against tiles.
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
        const double us = gpu_test::MedianCapturedUs(o.stream, run_all) / kLayers;
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
      }
    }
  }
}

// The expert GEMMs alone (gate_up then down, the shared experts as the dense group), the GEMVs
// (LaunchMoeGemv) against the tiled GEMMs (LaunchMoeGemm, LaunchMoeGemmMxfp4) on the same
// permutation, at the three models' decode shapes: each GEMM pair's time per layer and the rate
// at which it streams the weight bytes it reads (the touched experts' and the shared experts';
// MXFP4 values and scales as stored, k padded to 128), and that floor over the copy rate of the
// same run. Zero weights (the time does not depend on the values); random routings, distinct
// experts per token; four layers' weights in turn so that the L2 does not hold the next layer's.
//
//   build/cuda/tests/gpu_tests "[.bench][moe_small]"
TEST_CASE("MoE expert GEMMs benchmark: decode batches, GEMVs against tiles",
          "[.bench][moe_small]") {
  gpu_test::BenchOps o;
  constexpr int kLayers = 4;
  struct Shape {
    const char* name;
    int E, K, H, I, SI;
    bool mx;  // gpt-oss: MXFP4 experts with biases, clamped SwiGLU
  };
  const double copy_rate = gpu_test::MeasureCopyRate(o.stream);
  std::printf("copy rate %.2f TB/s (read + write)\n", copy_rate / 1e12);
  std::printf("%-16s %5s %-6s %10s %8s %10s %8s %8s\n", "experts of", "batch", "gemms", "us/layer",
              "TB/s", "floor us", "x floor", "x tiled");
  for (const Shape sh : {Shape{"qwen3-30b-a3b", 128, 8, 2048, 768, 0, false},
                         Shape{"deepseek-v2-lite", 64, 6, 2048, 1408, 2 * 1408, false},
                         Shape{"gpt-oss-20b", 32, 4, 2880, 2880, 0, true}}) {
    const int E = sh.E, K = sh.K, H = sh.H, I = sh.I, SI = sh.SI;
    const int kp_h = cuda::MoeMxfp4KPad(H), kp_i = cuda::MoeMxfp4KPad(I);
    // Bytes of one expert's gate_up and down weights as the kernels read them.
    const size_t gu_bytes = sh.mx ? static_cast<size_t>(2) * I * (kp_h / 2 + kp_h / 32)
                                  : static_cast<size_t>(2) * I * H * 2;
    const size_t dn_bytes = sh.mx ? static_cast<size_t>(1) * H * (kp_i / 2 + kp_i / 32)
                                  : static_cast<size_t>(1) * H * I * 2;
    std::vector<DeviceBuffer> gu(kLayers), dn(kLayers), gu_s(kLayers), dn_s(kLayers), sgu(kLayers),
        sdn(kLayers), gu_b(kLayers), dn_b(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      const size_t gu_w = sh.mx ? static_cast<size_t>(2) * I * kp_h / 2 : gu_bytes;
      const size_t dn_w = sh.mx ? static_cast<size_t>(1) * H * kp_i / 2 : dn_bytes;
      REQUIRE(gu[l].Alloc(E * gu_w).ok());
      REQUIRE(dn[l].Alloc(E * dn_w).ok());
      CUDA_REQUIRE(cudaMemset(gu[l].ptr, 0, E * gu_w));
      CUDA_REQUIRE(cudaMemset(dn[l].ptr, 0, E * dn_w));
      if (sh.mx) {  // scale bytes 127 (2^0), fp32 biases
        REQUIRE(gu_s[l].Alloc(static_cast<size_t>(E) * 2 * I * kp_h / 32).ok());
        REQUIRE(dn_s[l].Alloc(static_cast<size_t>(E) * H * kp_i / 32).ok());
        CUDA_REQUIRE(cudaMemset(gu_s[l].ptr, 127, gu_s[l].bytes));
        CUDA_REQUIRE(cudaMemset(dn_s[l].ptr, 127, dn_s[l].bytes));
        REQUIRE(gu_b[l].Alloc(static_cast<size_t>(E) * 2 * I * 4).ok());
        REQUIRE(dn_b[l].Alloc(static_cast<size_t>(E) * H * 4).ok());
        CUDA_REQUIRE(cudaMemset(gu_b[l].ptr, 0, gu_b[l].bytes));
        CUDA_REQUIRE(cudaMemset(dn_b[l].ptr, 0, dn_b[l].bytes));
      }
      if (SI > 0) {
        REQUIRE(sgu[l].Alloc(static_cast<size_t>(2) * SI * H * 2).ok());
        REQUIRE(sdn[l].Alloc(static_cast<size_t>(H) * SI * 2).ok());
        CUDA_REQUIRE(cudaMemset(sgu[l].ptr, 0, sgu[l].bytes));
        CUDA_REQUIRE(cudaMemset(sdn[l].ptr, 0, sdn[l].bytes));
      }
    }
    for (const int T : {1, 2, 4, 8, 16}) {
      const int S = T * K, D = SI > 0 ? T : 0;
      const int tile_rows = sh.mx ? cuda::MoeMxfp4TileRows(T, K, E) : cuda::kMoeTileRows;
      const int max_tiles = cuda::MoeMaxTiles(S, E, D, tile_rows);
      std::mt19937 rng(T);
      std::uniform_int_distribution<int> pick(0, E - 1);
      std::vector<int32_t> ids(S);
      std::vector<char> used(E, 0);
      for (int t = 0; t < T; ++t) {
        for (int k = 0; k < K; ++k) {
          int e;
          do {
            e = pick(rng);
          } while (std::find(ids.begin() + t * K, ids.begin() + t * K + k, e) !=
                   ids.begin() + t * K + k);
          ids[t * K + k] = e;
          used[e] = 1;
        }
      }
      const double touched = static_cast<double>(std::count(used.begin(), used.end(), 1));
      const double bytes = touched * (gu_bytes + dn_bytes) + (SI > 0 ? 3.0 * SI * H * 2 : 0.0);
      const double floor_us = bytes / copy_rate * 1e6;
      DeviceBuffer d_ids, sorted, slot_of, tiles, num_tiles, x, act, sact, y, sout;
      REQUIRE(d_ids.Alloc(S * 4).ok());
      REQUIRE(sorted.Alloc(S * 4).ok());
      REQUIRE(slot_of.Alloc(S * 4).ok());
      REQUIRE(tiles.Alloc(static_cast<size_t>(3) * max_tiles * 4 + 16).ok());
      REQUIRE(num_tiles.Alloc(16).ok());
      REQUIRE(x.Alloc(static_cast<size_t>(T) * H * 2).ok());
      REQUIRE(act.Alloc(static_cast<size_t>(S) * I * 2).ok());
      REQUIRE(y.Alloc(static_cast<size_t>(S) * H * 2).ok());
      REQUIRE(sact.Alloc(static_cast<size_t>(std::max(D, 1)) * std::max(SI, 1) * 2).ok());
      REQUIRE(sout.Alloc(static_cast<size_t>(std::max(D, 1)) * H * 2).ok());
      CUDA_REQUIRE(cudaMemset(x.ptr, 0, x.bytes));
      CUDA_REQUIRE(cudaMemcpy(d_ids.ptr, ids.data(), S * 4, cudaMemcpyHostToDevice));
      cuda::MoePermuteArgs pa;
      pa.topk_ids = d_ids.as<int32_t>();
      pa.num_slots = S;
      pa.num_experts = E;
      pa.top_k = K;
      pa.dense_rows = D;
      pa.tile_rows = tile_rows;
      pa.sorted_token = sorted.as<int32_t>();
      pa.slot_of = slot_of.as<int32_t>();
      pa.tiles = tiles.as<int32_t>();
      pa.num_tiles = num_tiles.as<int32_t>();
      cuda::LaunchMoePermute(pa, o.stream);
      CUDA_REQUIRE(cudaStreamSynchronize(o.stream));
      double tiled_us = 0;
      // Variant 0: tiled; 1: the GEMVs as the layer launches them; 2-4 (MXFP4 only): the GEMVs
      // with 1, 2 and 4 warps splitting k.
      for (int variant = 0; variant <= (sh.mx ? 4 : 1); ++variant) {
        const bool gemv = variant > 0;
        const int split_k = variant >= 2 ? 1 << (variant - 2) : 0;
        if (gemv && !cuda::MoeGemvBatchOk(T, K, E)) continue;
        auto run_all = [&] {
          for (int l = 0; l < kLayers; ++l) {
            cuda::MoeGemmArgs g;
            g.x = x.ptr;
            g.sorted_token = sorted.as<int32_t>();
            g.w = gu[l].ptr;
            g.silu_mul = true;
            g.n_out = I;
            g.k = H;
            g.tiles = tiles.as<int32_t>();
            g.num_tiles = num_tiles.as<int32_t>();
            g.max_tiles = max_tiles;
            g.tile_rows = tile_rows;
            g.out = act.ptr;
            g.gemv_max_rows = T;
            g.gemv_split_k = split_k;
            if (sh.mx) {
              g.mx_scales = gu_s[l].as<uint8_t>();
              g.mx_k_pad = kp_h;
              g.bias = gu_b[l].as<float>();
              g.swiglu_limit = 7.0f;
            }
            if (SI > 0) {
              g.dense_x = x.ptr;
              g.dense_w = sgu[l].ptr;
              g.dense_n_out = SI;
              g.dense_k = H;
              g.dense_out = sact.ptr;
            }
            auto launch = [&] {
              if (gemv) {
                REQUIRE(cuda::LaunchMoeGemv(g, o.stream));
              } else if (sh.mx) {
                REQUIRE(cuda::LaunchMoeGemmMxfp4(g, o.stream));
              } else {
                cuda::LaunchMoeGemm(g, o.stream);
              }
            };
            launch();
            g.x = act.ptr;
            g.sorted_token = nullptr;
            g.w = dn[l].ptr;
            g.silu_mul = false;
            g.n_out = H;
            g.k = I;
            g.out = y.ptr;
            g.swiglu_limit = 0.0f;
            if (sh.mx) {
              g.mx_scales = dn_s[l].as<uint8_t>();
              g.mx_k_pad = kp_i;
              g.bias = dn_b[l].as<float>();
            }
            if (SI > 0) {
              g.dense_x = sact.ptr;
              g.dense_w = sdn[l].ptr;
              g.dense_n_out = H;
              g.dense_k = SI;
              g.dense_out = sout.ptr;
            }
            launch();
          }
        };
        const double us = gpu_test::MedianCapturedUs(o.stream, run_all) / kLayers;
        if (!gemv) tiled_us = us;
        char vs_tiled[16] = "-";
        if (gemv) std::snprintf(vs_tiled, sizeof(vs_tiled), "%.2f", us / tiled_us);
        char label[16];
        std::snprintf(label, sizeof(label), "%s", !gemv ? "tiled" : "gemv");
        if (split_k > 0) std::snprintf(label, sizeof(label), "gemv/%d", split_k);
        std::printf("%-16s %5d %-6s %10.1f %8.2f %10.1f %8.2f %8s\n", sh.name, T, label, us,
                    bytes / us / 1e6, floor_us, us / floor_us, vs_tiled);
      }
    }
  }
}

}  // namespace
}  // namespace llm
