// The fused small-batch MoE routing (kernels/cuda/moe/moe_ops.h, LaunchMoeRouteFused) on its own:
// its logits against an fp64 dot product on the host, its routing against MoeRouter on those same
// logits (ids equal, exact ties included; weights up to the float rounding of expf and of the
// softmax sum), its permutation (and expert offsets) against LaunchMoePermute on the same ids,
// for every routing rule of MoeRouteArgs, batches 1..kMoeRouteFusedMaxTokens, with and without a
// dense group (shared experts), tiles of 16, 32 and 64 rows; and the same bits on every launch (its
// ticket back at zero each time). The whole layer with this routing, eager and in CUDA graphs:
// test_moe_layer.cc.
//
//   build/cuda/tests/gpu_tests "[moe]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/layers/cuda/cuda_moe_layer.h"
#include "engine/layers/moe_router.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_routings.h"

namespace llm {
namespace {

using cuda::Download;
using cuda::Upload;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

// Device buffers of one fused launch and of the reference permutation, sized for the largest
// batch; every output is refilled with garbage before each launch so a stale value cannot pass.
struct FusedBuffers {
  int E = 0, K = 0, H = 0, max_tiles = 0;
  float *x = nullptr, *router = nullptr, *bias = nullptr, *logit_bias = nullptr;
  float *logits = nullptr, *partials = nullptr, *topk_w = nullptr;
  uint32_t* ticket = nullptr;
  int32_t *topk_ids = nullptr, *sorted = nullptr, *slot_of = nullptr, *tiles = nullptr,
          *num_tiles = nullptr;
  int32_t *ref_sorted = nullptr, *ref_slot_of = nullptr, *ref_tiles = nullptr,
          *ref_num_tiles = nullptr;
  int32_t *offsets = nullptr, *ref_offsets = nullptr;  // [E + 1]

  FusedBuffers(int experts, int top_k, int hidden) : E(experts), K(top_k), H(hidden) {
    const int T = cuda::kMoeRouteFusedMaxTokens, S = T * K;
    max_tiles = cuda::MoeMaxTiles(S, E, T, 16);
    x = Upload(std::vector<float>(static_cast<size_t>(T) * H));
    logits = Upload(std::vector<float>(static_cast<size_t>(T) * E));
    partials = Upload(std::vector<float>(cuda::MoeRouteFusedPartials(T, E, H)));
    topk_w = Upload(std::vector<float>(S));
    ticket = Upload(std::vector<uint32_t>{0});
    for (int32_t** p : {&topk_ids, &sorted, &slot_of, &ref_sorted, &ref_slot_of}) {
      *p = Upload(std::vector<int32_t>(S));
    }
    for (int32_t** p : {&tiles, &ref_tiles}) *p = Upload(std::vector<int32_t>(3 * max_tiles));
    for (int32_t** p : {&num_tiles, &ref_num_tiles}) *p = Upload(std::vector<int32_t>(1));
    for (int32_t** p : {&offsets, &ref_offsets}) *p = Upload(std::vector<int32_t>(E + 1));
  }
  ~FusedBuffers() {
    for (void* p :
         {static_cast<void*>(x), static_cast<void*>(router), static_cast<void*>(bias),
          static_cast<void*>(logit_bias), static_cast<void*>(logits), static_cast<void*>(partials),
          static_cast<void*>(topk_w), static_cast<void*>(ticket), static_cast<void*>(topk_ids),
          static_cast<void*>(sorted), static_cast<void*>(slot_of), static_cast<void*>(tiles),
          static_cast<void*>(num_tiles), static_cast<void*>(ref_sorted),
          static_cast<void*>(ref_slot_of), static_cast<void*>(ref_tiles),
          static_cast<void*>(ref_num_tiles), static_cast<void*>(offsets),
          static_cast<void*>(ref_offsets)}) {
      if (p) cudaFree(p);
    }
  }
  void Garbage(int T) {
    const int S = T * K;
    CUDA_REQUIRE(cudaMemset(logits, 0xff, static_cast<size_t>(T) * E * 4));  // NaN
    CUDA_REQUIRE(cudaMemset(topk_w, 0xff, S * 4));
    CUDA_REQUIRE(cudaMemset(topk_ids, 0x7f, S * 4));
    for (int32_t* p : {sorted, slot_of, ref_sorted, ref_slot_of}) {
      CUDA_REQUIRE(cudaMemset(p, 0x7e, S * 4));
    }
    for (int32_t* p : {tiles, ref_tiles}) CUDA_REQUIRE(cudaMemset(p, 0x7e, max_tiles * 12));
    for (int32_t* p : {num_tiles, ref_num_tiles}) CUDA_REQUIRE(cudaMemset(p, 0x7e, 4));
    for (int32_t* p : {offsets, ref_offsets}) CUDA_REQUIRE(cudaMemset(p, 0x7e, (E + 1) * 4));
  }
  // with_offsets: expert_offsets too (the large-batch path's; the layer's small batches skip it).
  cuda::MoePermuteArgs Permute(int T, int dense_rows, int tile_rows, bool ref,
                               bool with_offsets) const {
    cuda::MoePermuteArgs p;
    p.topk_ids = topk_ids;
    p.num_slots = T * K;
    p.num_experts = E;
    p.top_k = K;
    p.dense_rows = dense_rows;
    p.tile_rows = tile_rows;
    p.sorted_token = ref ? ref_sorted : sorted;
    p.slot_of = ref ? ref_slot_of : slot_of;
    p.tiles = ref ? ref_tiles : tiles;
    p.num_tiles = ref ? ref_num_tiles : num_tiles;
    if (with_offsets) p.expert_offsets = ref ? ref_offsets : offsets;
    return p;
  }
};

struct Variant {
  std::string name;
  MoeRouting routing;
  int hidden;
  bool selection_bias, logit_bias;
};

TEST_CASE("Fused MoE routing: fp64 logits, MoeRouter's choice and LaunchMoePermute's tiles",
          "[gpu][moe]") {
  GPU_TEST_RNG(rng);
  const std::vector<Variant> variants = {
      {"qwen3-30b-a3b 128x8, softmax, normalized", gpu_test::GreedyRouting(128, 8), 2048, false,
       false},
      {"deepseek-v2-lite 64x6, greedy softmax, unnormalized",
       [] {
         MoeRouting r = gpu_test::GreedyRouting(64, 6);
         r.normalize = false;
         return r;
       }(),
       2048, false, false},
      {"deepseek-v2 64x6, group max, scaled", gpu_test::V2Routing(64, 6), 1024, false, false},
      {"deepseek-v3 256x8, sigmoid, noaux_tc (8 groups), bias, scaled",
       [] {
         MoeRouting r = gpu_test::V3Routing(256, 8);
         r.n_group = 8;
         r.topk_group = 4;
         return r;
       }(),
       1000, true, false},  // hidden not a multiple of the CTA's 256 columns
      {"gpt-oss-20b 32x4, softmax of the top-k, logit bias", gpu_test::GptOssRouting(32, 4), 2880,
       false, true},
      {"mixtral 8x2 (fewer experts than a CTA's rows)", gpu_test::GreedyRouting(8, 2), 512, false,
       false},
      {"512x1 (the most experts)", gpu_test::GreedyRouting(512, 1), 256, false, false},
  };
  {  // what the kernel does not serve is refused, nothing launched
    cuda::MoeRouteFusedArgs a;
    a.hidden = 256;
    a.route.num_tokens = cuda::kMoeRouteFusedMaxTokens + 1;
    CHECK_FALSE(cuda::LaunchMoeRouteFused(a, nullptr));
    a.route.num_tokens = 1;
    a.hidden = 258;  // rows read as float4
    CHECK_FALSE(cuda::LaunchMoeRouteFused(a, nullptr));
  }
  for (const Variant& v : variants) {
    const MoeRouting& r = v.routing;
    const int E = r.num_experts, K = r.top_k, H = v.hidden;
    REQUIRE(CudaMoeLayer::Check(r, 256, 128, 0).ok());  // the rule is one the layer takes
    for (const bool discrete : {false, true}) {
      INFO(v.name << ", hidden " << H
                  << (discrete ? ", discrete logits (exact ties)" : ", continuous logits"));
      FusedBuffers b(E, K, H);
      std::normal_distribution<float> nd(0.f, 1.f);
      // Continuous: router N(0, 4 / H), x N(0, 1): logits of std 2. Discrete: router entries in
      // {0, 0.5}, x three ones: logits in {0, 0.5, 1, 1.5}, exact in any summation order, with
      // exact ties in every token (and no two different pairs of sigmoid values with the same
      // sum: a rounding-decided group tie).
      std::vector<float> router(static_cast<size_t>(E) * H);
      std::uniform_int_distribution<int> bit(0, 1);
      for (float& w : router) w = discrete ? 0.5f * bit(rng) : 2.0f / std::sqrt(float(H)) * nd(rng);
      b.router = Upload(router);
      std::vector<float> bias, logit_bias;
      if (v.selection_bias && !discrete) {
        bias.resize(E);
        for (float& x : bias) x = 0.1f * nd(rng);
        b.bias = Upload(bias);
      }
      if (v.logit_bias) {
        logit_bias.resize(E);
        for (float& x : logit_bias) x = discrete ? 0.5f * bit(rng) : 0.5f * nd(rng);
        b.logit_bias = Upload(logit_bias);
      }
      int ties = 0, near = 0, tokens = 0;
      for (int T = 1; T <= cuda::kMoeRouteFusedMaxTokens; ++T) {
        INFO("T " << T);
        REQUIRE(cuda::MoeRouteFusedOk(T, H));
        std::vector<float> x(static_cast<size_t>(T) * H, 0.f);
        if (discrete) {
          std::uniform_int_distribution<int> col(0, H - 1);
          for (int t = 0; t < T; ++t) {
            for (int n = 0; n < 3;) {
              float& c = x[static_cast<size_t>(t) * H + col(rng)];
              if (c == 0.f) c = 1.f, ++n;
            }
          }
        } else {
          for (float& c : x) c = nd(rng);
        }
        CUDA_REQUIRE(cudaMemcpy(b.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        // fp64 logits, and the scale of their rounding (sum of |products|).
        std::vector<double> ref(static_cast<size_t>(T) * E), scale(ref.size());
        for (int t = 0; t < T; ++t) {
          for (int e = 0; e < E; ++e) {
            double d = 0, a = 0;
            for (int h = 0; h < H; ++h) {
              const double p = static_cast<double>(router[static_cast<size_t>(e) * H + h]) *
                               x[static_cast<size_t>(t) * H + h];
              d += p;
              a += std::fabs(p);
            }
            ref[static_cast<size_t>(t) * E + e] = d;
            scale[static_cast<size_t>(t) * E + e] = a;
          }
        }
        std::vector<float> first_logits;
        for (const int dense_rows : {0, T}) {
          for (const int tile_rows : {16, 32, 64}) {
            INFO("dense rows " << dense_rows << ", tiles of " << tile_rows);
            b.Garbage(T);
            cuda::MoeRouteFusedArgs a;
            a.x = b.x;
            a.router = b.router;
            a.hidden = H;
            a.logits = b.logits;
            a.partials = b.partials;
            a.ticket = b.ticket;
            a.route = MoeRouteArgsOf(r);
            a.route.bias = b.bias;
            a.route.logit_bias = b.logit_bias;
            a.route.num_tokens = T;
            a.route.topk_ids = b.topk_ids;
            a.route.topk_w = b.topk_w;
            const bool with_offsets = tile_rows == 32;
            a.permute = b.Permute(T, dense_rows, tile_rows, false, with_offsets);
            REQUIRE(cuda::LaunchMoeRouteFused(a, nullptr));
            CUDA_REQUIRE(cudaDeviceSynchronize());
            REQUIRE(Download(b.ticket, 1)[0] == 0u);  // back at zero for the next launch
            const std::vector<float> logits = Download(b.logits, static_cast<size_t>(T) * E);
            if (first_logits.empty()) {
              for (size_t i = 0; i < logits.size(); ++i) {
                INFO("logit " << i << ": " << logits[i] << " against " << ref[i]);
                if (discrete) {
                  REQUIRE(logits[i] == ref[i]);
                } else {  // a few dozen roundings deep: well within 4e-6 of the sum of |products|
                  REQUIRE(std::fabs(logits[i] - ref[i]) <= 4e-6 * scale[i] + 1e-30);
                }
              }
              first_logits = logits;
            } else {
              REQUIRE(logits == first_logits);  // the same bits on every launch
            }
            // The routing against MoeRouter on the kernel's own logits (+ the router's bias,
            // added in fp32 as the kernel adds it).
            const std::vector<int32_t> ids = Download(b.topk_ids, T * K);
            const std::vector<float> w = Download(b.topk_w, T * K);
            MoeRouter router_cpu(r);
            for (int t = 0; t < T; ++t) {
              std::vector<float> l(logits.begin() + t * E, logits.begin() + (t + 1) * E);
              for (int e = 0; e < E && !logit_bias.empty(); ++e) l[e] += logit_bias[e];
              std::vector<int32_t> ref_ids(K);
              std::vector<float> ref_w(K);
              float margin = 0.f;
              router_cpu.Route(l.data(), bias.empty() ? nullptr : bias.data(), ref_ids.data(),
                               ref_w.data(), &margin);
              const bool counted = dense_rows == 0 && tile_rows == 16;
              if (counted) {
                ++tokens;
                ties += margin == 0.f;
              }
              // expf and the softmax sum round differently on the host: a continuous near-tie
              // may go either way (exact ties may not).
              if (!discrete && margin > 0.f && margin < 1e-5f) {
                near += counted;
                continue;
              }
              INFO("token " << t << " margin " << margin);
              const std::vector<int32_t> got(ids.begin() + t * K, ids.begin() + (t + 1) * K);
              REQUIRE(got == ref_ids);
              for (int k = 0; k < K; ++k) {
                REQUIRE(w[t * K + k] == Approx(ref_w[k]).epsilon(1e-5).margin(1e-7));
              }
            }
            // The permutation against LaunchMoePermute on the same ids.
            cuda::LaunchMoePermute(b.Permute(T, dense_rows, tile_rows, true, with_offsets),
                                   nullptr);
            CUDA_REQUIRE(cudaDeviceSynchronize());
            const int S = T * K;
            CHECK(Download(b.sorted, S) == Download(b.ref_sorted, S));
            CHECK(Download(b.slot_of, S) == Download(b.ref_slot_of, S));
            const int32_t n = Download(b.num_tiles, 1)[0];
            REQUIRE(n == Download(b.ref_num_tiles, 1)[0]);
            REQUIRE(n >= 1);
            REQUIRE(n <= cuda::MoeMaxTiles(S, E, dense_rows, tile_rows));
            CHECK(Download(b.tiles, 3 * b.max_tiles) == Download(b.ref_tiles, 3 * b.max_tiles));
            if (with_offsets) CHECK(Download(b.offsets, E + 1) == Download(b.ref_offsets, E + 1));
          }
        }
      }
      if (discrete) CHECK(ties > 0);  // the case exercised exact ties
      CHECK(near <= std::max(1, tokens / 20));
    }
  }
}

}  // namespace
}  // namespace llm
