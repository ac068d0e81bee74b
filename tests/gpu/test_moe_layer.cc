// The device-only MoE layer (engine/layers/cuda/cuda_moe_layer.h) against the CPU oracle: the
// routing kernel against MoeRouter (random logits, exact ties, group limits), the whole layer
// against CpuMoe with bf16 and fp8 expert weights at batch 1, 7, 16 (the fused small-batch routing)
// and 17, 64, 300 (the unfused one), fp8 experts also with fp8 activations (the W8A8 GEMMs, whose
// exact arithmetic test_moe_w8a8.cc checks), and the layer captured in a CUDA graph and replayed on
// new inputs against eager runs, with either routing. (The fused routing kernel on its own:
// test_moe_route_fused.cc.)
//
//   build/.../tests/gpu_tests "[moe]"
#include <catch2/catch.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "engine/layers/cpu/cpu_moe.h"
#include "engine/layers/cuda/cuda_fp8_gemm.h"
#include "engine/layers/cuda/cuda_moe_layer.h"
#include "engine/layers/moe_router.h"
#include "engine/loader/model_config.h"
#include "engine/loader/safetensors.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_layer_ops.h"
#include "tests/gpu/moe_routings.h"
#include "tests/gpu/random_fp8_llama.h"

namespace llm {
namespace {

using cuda::Download;
using cuda::Upload;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

float RoundBf16(float x) {
  return Bf16ToF32(F32ToBf16(x));
}

using gpu_test::GptOssRouting;
using gpu_test::GreedyRouting;
using gpu_test::V2Routing;
using gpu_test::V3Routing;

// GPU routing of logits [T, E] (+ bias) -> ids, weights.
void GpuRoute(const MoeRouting& r, const std::vector<float>& logits, const std::vector<float>& bias,
              int T, std::vector<int32_t>* ids, std::vector<float>* w) {
  float* d_l = Upload(logits);
  float* d_b = bias.empty() ? nullptr : Upload(bias);
  int32_t* d_ids = Upload(std::vector<int32_t>(T * r.top_k, -7));
  float* d_w = Upload(std::vector<float>(T * r.top_k, 0.f));
  cuda::MoeRouteArgs a = MoeRouteArgsOf(r);
  a.logits = d_l;
  a.bias = d_b;
  a.num_tokens = T;
  a.topk_ids = d_ids;
  a.topk_w = d_w;
  cuda::LaunchMoeRoute(a, nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  *ids = Download(d_ids, T * r.top_k);
  *w = Download(d_w, T * r.top_k);
  for (void* p : {static_cast<void*>(d_l), static_cast<void*>(d_b), static_cast<void*>(d_ids),
                  static_cast<void*>(d_w)}) {
    if (p) cudaFree(p);
  }
}

TEST_CASE("MoE routing kernel matches MoeRouter (ties, groups, bias)", "[gpu][moe]") {
  GPU_TEST_RNG(rng);
  struct Case {
    const char* name;
    MoeRouting r;
    bool with_bias;
  };
  const std::vector<Case> cases = {
      {"v2 64x6", V2Routing(64, 6), false},
      {"v3 256x8 (8 groups)",
       [] {
         MoeRouting r = V3Routing(256, 8);
         r.n_group = 8;
         r.topk_group = 4;
         return r;
       }(),
       true},
      {"v3 16x4", V3Routing(16, 4), true},
      {"greedy 8x2", GreedyRouting(8, 2), false},
      {"greedy 128x8", GreedyRouting(128, 8), false},
      {"greedy 512x1", GreedyRouting(512, 1), false},
      {"gpt-oss 32x4", GptOssRouting(32, 4), false},
  };
  for (const Case& c : cases) {
    for (const bool discrete : {false, true}) {
      INFO(c.name << (discrete ? " discrete logits (exact ties)" : " continuous logits"));
      const int T = 257, E = c.r.num_experts, K = c.r.top_k;
      std::vector<float> logits(static_cast<size_t>(T) * E), bias;
      std::normal_distribution<float> nd(0.f, 2.f);
      // Discrete logits in {0, 0.5, 1, 1.5}: exact ties within a run on both sides, and no two
      // different pairs of sigmoid values with the same sum (a rounding-decided group tie).
      std::uniform_int_distribution<int> ud(0, 3);
      for (float& x : logits) x = discrete ? 0.5f * ud(rng) : nd(rng);
      if (c.with_bias && !discrete) {
        bias.resize(E);
        for (float& b : bias) b = 0.1f * nd(rng);
      }
      std::vector<int32_t> ids;
      std::vector<float> w;
      GpuRoute(c.r, logits, bias, T, &ids, &w);
      MoeRouter router(c.r);
      int ties = 0, near = 0;
      for (int t = 0; t < T; ++t) {
        std::vector<int32_t> ref_ids(K);
        std::vector<float> ref_w(K);
        float margin = 0.f;
        router.Route(logits.data() + static_cast<size_t>(t) * E,
                     bias.empty() ? nullptr : bias.data(), ref_ids.data(), ref_w.data(), &margin);
        ties += margin == 0.f;
        const std::vector<int32_t> got(ids.begin() + t * K, ids.begin() + (t + 1) * K);
        if (!discrete && margin < 1e-5f) {  // float rounding of expf / the sum may decide it
          ++near;
          continue;
        }
        INFO("token " << t << " margin " << margin);
        REQUIRE(got == ref_ids);
        for (int k = 0; k < K; ++k) {
          REQUIRE(w[t * K + k] == Approx(ref_w[k]).epsilon(1e-5).margin(1e-7));
        }
      }
      if (discrete) CHECK(ties > 0);  // the case exercised exact ties
      CHECK(near <= T / 20);
    }
  }
}

// The fp8 grouped GEMM on one-hot activation rows: out[m, n] = W[n, m] exactly (one product with
// 1.0, scale 1), so every e4m3 code, subnormals included, must come out of the
// kernel's register widening as its exact value (the NaN codes are not weights).
TEST_CASE("MoE fp8 GEMM widens every e4m3 code exactly", "[gpu][moe][fp8]") {
  const int N = cuda::kMoeGemmN, K = cuda::kMoeGemmK, M = 16;
  std::vector<uint8_t> w(static_cast<size_t>(N) * K, 0);
  for (int n = 0; n < N; ++n) {
    for (int m = 0; m < M; ++m) {
      const int code = (n * M + m) & 0xff;
      w[static_cast<size_t>(n) * K + m] = (code & 0x7f) == 0x7f ? 0 : static_cast<uint8_t>(code);
    }
  }
  std::vector<uint16_t> x(static_cast<size_t>(M) * K, 0);
  for (int m = 0; m < M; ++m) x[static_cast<size_t>(m) * K + m] = F32ToBf16(1.0f);
  uint8_t* d_w = Upload(w);
  uint16_t* d_x = Upload(x);
  float* d_scale = Upload(std::vector<float>{1.0f});
  int32_t* d_tiles = Upload(std::vector<int32_t>{0, 0, M});
  int32_t* d_num_tiles = Upload(std::vector<int32_t>{1});
  uint16_t* d_out = Upload(std::vector<uint16_t>(static_cast<size_t>(M) * N, 0xffff));
  cuda::MoeGemmArgs a;
  a.x = d_x;
  a.w = d_w;
  a.w_scale.scale = d_scale;
  a.fp8 = true;
  a.n_out = N;
  a.k = K;
  a.tiles = d_tiles;
  a.num_tiles = d_num_tiles;
  a.max_tiles = 1;
  a.out = d_out;
  cuda::LaunchMoeGemm(a, nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<uint16_t> out = Download(d_out, static_cast<size_t>(M) * N);
  int checked = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      const uint8_t q = w[static_cast<size_t>(n) * K + m];
      INFO("code 0x" << std::hex << static_cast<int>(q));
      const float want = DequantizeFp8(q, 1.0f);
      REQUIRE(Bf16ToF32(out[static_cast<size_t>(m) * N + n]) == want);  // -0 sums to +0
      ++checked;
    }
  }
  CHECK(checked == M * N);
  for (void* p :
       {static_cast<void*>(d_w), static_cast<void*>(d_x), static_cast<void*>(d_scale),
        static_cast<void*>(d_tiles), static_cast<void*>(d_num_tiles), static_cast<void*>(d_out)}) {
    cudaFree(p);
  }
}

// The large-batch path's quantizer beside 128x128 block-scaled experts, against base/quant.h:
// every row's e4m3 bytes per 128-wide block (the last one partial), and each block's scale in its
// expert's own [blocks][MoeFp8ExpertRows(count)] matrix, the matrices back to back in expert
// order (experts without rows, with counts past 256, a last expert ending the rows).
TEST_CASE("MoE large-batch fp8 quantizer writes each expert's block scales as its GEMM reads them",
          "[gpu][moe][fp8]") {
  GPU_TEST_RNG(rng);
  const int cols = 320, blocks = 3;  // the last block 64 wide
  const std::vector<int32_t> off = {0, 5, 5, 262, 263, 300};
  const int E = static_cast<int>(off.size()) - 1, rows = off.back();
  CHECK(cuda::MoeFp8ExpertRows(5) == 16);
  CHECK(cuda::MoeFp8ExpertRows(257) == 384);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(static_cast<size_t>(rows) * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = F32ToBf16(nd(rng) * (1 + static_cast<int>(i % 7)));
  int padded = 0;
  for (int e = 0; e < E; ++e) padded += cuda::MoeFp8ExpertRows(off[e + 1] - off[e]);
  cuda::DeviceAllocs d;
  const uint16_t* d_x = d.Up(x);
  const int32_t* d_off = d.Up(off);
  uint8_t* d_q = d.Up(std::vector<uint8_t>(x.size(), 0));
  float* d_s = d.Up(std::vector<float>(static_cast<size_t>(padded) * blocks, -1.f));
  cuda::LaunchMoeQuantizeBlocks128ByExpert(d_x, rows, cols, d_off, E, d_q, d_s, nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<uint8_t> q = Download(d_q, x.size());
  const std::vector<float> sc = Download(d_s, static_cast<size_t>(padded) * blocks);
  size_t base = 0;
  int checked = 0;
  for (int e = 0; e < E; ++e) {
    const int count = off[e + 1] - off[e], ld = cuda::MoeFp8ExpertRows(count);
    for (int r = 0; r < ld; ++r) {
      for (int b = 0; b < blocks; ++b) {
        INFO("expert " << e << " row " << r << " block " << b);
        const float got = sc[base + static_cast<size_t>(b) * ld + r];
        if (r >= count) {  // padding: never written
          CHECK(got == -1.f);
          continue;
        }
        const size_t row = static_cast<size_t>(off[e] + r);
        float amax = 0.f;
        for (int c = b * 128; c < std::min(cols, b * 128 + 128); ++c) {
          amax = std::max(amax, std::fabs(Bf16ToF32(x[row * cols + c])));
        }
        const float want = DynamicScale(amax, kFp8E4M3Max);
        REQUIRE(got == want);
        for (int c = b * 128; c < std::min(cols, b * 128 + 128); ++c) {
          REQUIRE(q[row * cols + c] == QuantizeFp8(Bf16ToF32(x[row * cols + c]), want));
        }
        ++checked;
      }
    }
    base += static_cast<size_t>(ld) * blocks;
  }
  CHECK(checked == rows * blocks);
}

// A random MoE block in both forms: CpuMoe (fp32 copies of the device's weights, dequantized for
// fp8) and CudaMoeWeights.
struct TestMoe {
  int hidden = 256, inter = 128, shared_inter = 128;
  MoeRouting routing;
  CpuMoe cpu;
  CudaMoeWeights gpu;
};

std::vector<float> Dequant(const CudaLinear& lin, int groups, int n, int k) {
  const size_t per = static_cast<size_t>(n) * k;
  std::vector<uint8_t> q = Download(static_cast<const uint8_t*>(lin.data()), per * groups);
  std::vector<float> sc =
      Download(lin.scales(), static_cast<size_t>(groups) * CudaLinear::kScaleSlot);
  std::vector<float> f(per * groups);
  for (int g = 0; g < groups; ++g) {
    for (size_t i = 0; i < per; ++i) {
      f[g * per + i] = DequantizeFp8(q[g * per + i], sc[g * CudaLinear::kScaleSlot]);
    }
  }
  return f;
}

std::vector<float> FromBf16Device(const CudaLinear& lin, size_t n) {
  std::vector<uint16_t> b = Download(static_cast<const uint16_t*>(lin.data()), n);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = Bf16ToF32(b[i]);
  return f;
}

void UploadLinear(const CudaLinearOps& ops, const std::vector<float>& w, WeightQuant quant, int n,
                  int k, int groups, CudaLinear* lin) {
  std::vector<uint16_t> b(w.size());
  for (size_t i = 0; i < w.size(); ++i) b[i] = F32ToBf16(w[i]);
  REQUIRE(lin->bf16_target()->Alloc(b.size() * 2).ok());
  CUDA_REQUIRE(cudaMemcpy(lin->bf16_target()->ptr, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  REQUIRE(lin->Quantize(ops, quant, n, k, groups, "test").ok());
}

void MakeMoe(const CudaLinearOps& ops, WeightQuant quant, std::mt19937& rng, TestMoe* m) {
  const int E = m->routing.num_experts, H = m->hidden, I = m->inter, SI = m->shared_inter;
  std::normal_distribution<float> nd(0.f, 1.f);
  auto randv = [&](size_t n, float sd) {
    std::vector<float> v(n);
    for (float& x : v) x = RoundBf16(sd * nd(rng));
    return v;
  };
  m->cpu.routing = m->routing;
  m->cpu.router = randv(static_cast<size_t>(E) * H, 0.1f);
  REQUIRE(m->gpu.router.Alloc(m->cpu.router.size() * 4).ok());
  CUDA_REQUIRE(cudaMemcpy(m->gpu.router.ptr, m->cpu.router.data(), m->cpu.router.size() * 4,
                          cudaMemcpyHostToDevice));
  if (m->routing.weigh_unbiased) {
    m->cpu.selection_bias = randv(E, 0.05f);
    REQUIRE(m->gpu.router_bias.Alloc(E * 4).ok());
    CUDA_REQUIRE(cudaMemcpy(m->gpu.router_bias.ptr, m->cpu.selection_bias.data(), E * 4,
                            cudaMemcpyHostToDevice));
  }
  const float ws = 1.0f / std::sqrt(static_cast<float>(H)),
              wd = 1.0f / std::sqrt(static_cast<float>(I));
  const std::vector<float> gu = randv(static_cast<size_t>(E) * 2 * I * H, ws);
  const std::vector<float> dn = randv(static_cast<size_t>(E) * H * I, wd);
  UploadLinear(ops, gu, quant, 2 * I, H, E, &m->gpu.gate_up);
  UploadLinear(ops, dn, quant, H, I, E, &m->gpu.down);
  const bool fp8 = quant != WeightQuant::kBf16;
  const std::vector<float> gu_ref = fp8 ? Dequant(m->gpu.gate_up, E, 2 * I, H) : gu;
  const std::vector<float> dn_ref = fp8 ? Dequant(m->gpu.down, E, H, I) : dn;
  m->cpu.experts.assign(E, CpuMlp());
  for (int e = 0; e < E; ++e) {
    CpuMlp& x = m->cpu.experts[e];
    x.hidden = H;
    x.intermediate = I;
    x.w_gate_up.assign(gu_ref.begin() + static_cast<size_t>(e) * 2 * I * H,
                       gu_ref.begin() + static_cast<size_t>(e + 1) * 2 * I * H);
    x.w_down.assign(dn_ref.begin() + static_cast<size_t>(e) * H * I,
                    dn_ref.begin() + static_cast<size_t>(e + 1) * H * I);
  }
  const std::vector<float> sgu = randv(static_cast<size_t>(2) * SI * H, ws);
  const std::vector<float> sdn = randv(static_cast<size_t>(H) * SI, 1.0f / std::sqrt(float(SI)));
  m->gpu.shared.inter = SI;
  UploadLinear(ops, sgu, quant, 2 * SI, H, 1, &m->gpu.shared.gate_up);
  UploadLinear(ops, sdn, quant, H, SI, 1, &m->gpu.shared.down);
  m->cpu.shared.hidden = H;
  m->cpu.shared.intermediate = SI;
  m->cpu.shared.w_gate_up = fp8 ? Dequant(m->gpu.shared.gate_up, 1, 2 * SI, H) : sgu;
  m->cpu.shared.w_down = fp8 ? Dequant(m->gpu.shared.down, 1, H, SI) : sdn;
}

using Ops = gpu_test::MoeLayerOps;

// Runs the layer on x (fp32 values that bf16 holds exactly): returns out [T, hidden] as floats.
std::vector<float> RunGpu(const Ops& o, const CudaMoeLayer& layer, const CudaMoeWeights& w, int H,
                          const std::vector<float>& x, int T, CudaMoeScratch* s) {
  REQUIRE(layer.Reserve(T, s).ok());
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = F32ToBf16(x[i]);
  DeviceBuffer d_x, d_out;
  REQUIRE(d_x.Alloc(xb.size() * 2).ok());
  REQUIRE(d_out.Alloc(static_cast<size_t>(T) * H * 2).ok());
  CUDA_REQUIRE(cudaMemcpy(d_x.ptr, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemcpy(s->x_f32.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  REQUIRE(layer.Run(o.ops, w, d_x.ptr, T, s, d_out.ptr, {}).ok());
  CUDA_REQUIRE(cudaStreamSynchronize(o.stream));
  std::vector<uint16_t> ob = Download(d_out.as<uint16_t>(), static_cast<size_t>(T) * H);
  std::vector<float> out(ob.size());
  for (size_t i = 0; i < ob.size(); ++i) out[i] = Bf16ToF32(ob[i]);
  return out;
}

// The bound of a token's relative L2 error with bf16 activations: the bf16 roundings of act, y
// and the shared path (the oracle keeps fp32, fp8 weights dequantized exactly for it).
constexpr double kBf16ActBound = 0.02;
// With fp8 activations (W8A8: x and act quantized to e4m3 before their GEMMs), CpuMoe keeps them
// fp32: e4m3 keeps 3 mantissa bits (a rounding error up to 2^-4 of a value, about 2.5% RMS), and
// two quantized inputs in series (x, then act) give these shapes a per-token relative L2 error of
// 4.5% on average and 7.3% at most over 192 tokens (a numpy model of this test's layer with
// exact e4m3 rounding, per token and per 128-wide group alike). The bounds leave room for the
// tail of 300-token batches and still catch a wrong fragment, scale or row (errors near 100%);
// the exact arithmetic is test_moe_w8a8.cc's.
constexpr double kFp8ActBound = 0.12, kFp8ActMeanBound = 0.07;

// The layer on T random rows against the CPU oracle: each token's output within `bound`
// (relative L2), their mean within mean_bound. A token whose CPU routing is a near-tie (margin
// below min_margin) may pick other experts on the GPU: skipped. How many tokens are near-ties
// depends only on the random inputs (a few percent of them), so the bound is loose: a check
// that most tokens were compared, not a statistic that a seed can break.
void CheckAgainstCpu(const Ops& o, const CudaMoeLayer& layer, const CudaMoeWeights& w,
                     const CpuMoe& cpu, int H, int T, float min_margin, std::mt19937& rng,
                     CudaMoeScratch* s, double bound = kBf16ActBound, double mean_bound = 1.0) {
  INFO("batch " << T);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(T) * H);
  for (float& v : x) v = RoundBf16(nd(rng));
  std::vector<float> ref(x.size());
  std::vector<MoeRoutingDecision> decisions;
  std::vector<int32_t> pos(T, 0);
  cpu.Forward(x.data(), T, {&decisions, 0, pos.data()}, ref.data());
  const std::vector<float> got = RunGpu(o, layer, w, H, x, T, s);
  int skipped = 0;
  double sum = 0;
  for (int t = 0; t < T; ++t) {
    if (decisions[t].margin < min_margin) {
      ++skipped;
      continue;
    }
    double d2 = 0, r2 = 0;
    for (int j = 0; j < H; ++j) {
      const double d = got[t * H + j] - ref[t * H + j];
      d2 += d * d;
      r2 += static_cast<double>(ref[t * H + j]) * ref[t * H + j];
    }
    INFO("token " << t << " relative error " << std::sqrt(d2 / r2));
    REQUIRE(std::sqrt(d2) <= bound * std::sqrt(r2));
    sum += std::sqrt(d2 / r2);
  }
  CHECK(skipped <= T / 2 + 1);
  CHECK(sum <= mean_bound * std::max(1, T - skipped));
}

// Both expert-GEMM paths: the 16-row tiles (forced with INT_MAX slots per expert; batches of at
// most 16 tokens take the GEMVs there, cuda::LaunchMoeGemv, unless variant 4 turns them off)
// and the large-batch path through cuBLAS's grouped GEMM (forced with 0; by default from 64 slots
// per expert, here batch 300: 1,200 slots over 16 experts). Batches up to kMoeRouteFusedMaxTokens
// route through the fused kernel (with either GEMM path: it writes the large path's expert
// offsets too), larger ones through cuBLAS's router GEMM and the routing and permutation kernels.
TEST_CASE("MoE layer matches CpuMoe (bf16 and fp8 experts, batch 1..300, both GEMM paths)",
          "[gpu][moe]") {
  GPU_TEST_RNG(rng);
  Ops o;
  for (const WeightQuant quant : {WeightQuant::kBf16, WeightQuant::kFp8PerTensor}) {
    for (const bool v3 : {false, true}) {
      for (const int variant : {0, 1, 2, 3, 4}) {
        // tiles (and GEMVs); large-batch path (grouped GEMM, then per-expert GEMMs); the default
        // threshold; tiles without the GEMVs
        const int large_from = variant == 0 || variant == 4 ? INT_MAX
                               : variant == 3 ? CudaMoeLayer::kLargeBatchSlotsPerExpert
                                              : 0;
        INFO(WeightQuantName(quant) << (v3 ? " v3 routing" : " v2 routing") << ", large batch from "
                                    << large_from << " slots per expert, variant " << variant);
        TestMoe m;
        m.routing = v3 ? V3Routing(16, 4) : V2Routing(16, 4);
        MakeMoe(o.ops, quant, rng, &m);
        CudaMoeLayer layer(m.routing, m.hidden, m.inter, m.shared_inter);
        layer.set_large_batch_slots_per_expert(large_from);
        layer.set_gemv_max_tokens(variant == 4 ? 0 : cuda::kMoeGemvMaxTokens);
        layer.set_large_batch_gemm(variant == 1   ? CudaMoeLayer::LargeBatchGemm::kGrouped
                                   : variant == 2 ? CudaMoeLayer::LargeBatchGemm::kPerExpert
                                                  : CudaMoeLayer::LargeBatchGemm::kAuto);
        REQUIRE(CudaMoeLayer::Check(m.routing, m.hidden, m.inter, m.shared_inter).ok());
        CudaMoeScratch s;
        static_assert(cuda::kMoeRouteFusedMaxTokens == 16, "the batches below straddle it");
        for (const int T : {1, 7, 16, 17, 64, 300}) {
          CHECK(layer.UsesFusedRoute(T) == (T <= cuda::kMoeRouteFusedMaxTokens));
          // fp8 experts always take the tiles; bf16 ones the large-batch path where it is due.
          CHECK(layer.TakesLargeBatchPath(T, m.gpu) ==
                (quant == WeightQuant::kBf16 &&
                 int64_t{T} * m.routing.top_k >= int64_t{large_from} * 16));
          // The GEMVs (bf16 and fp8 experts): at most 4 slots per expert (T 16: 64 over 16).
          CHECK(layer.UsesGemv(T, m.gpu) == (variant != 4 && T <= 16));
          CheckAgainstCpu(o, layer, m.gpu, m.cpu, m.hidden, T, 1e-4f, rng, &s);
        }
      }
    }
  }
}

// Small batches have the down GEMM combine (the last tile of each column block sums its columns
// for every token): the same bits as LaunchMoeCombine, with shared experts (the dense group's
// tiles take tickets too) and without, bf16 and fp8 experts, through the GEMVs (their combine)
// and the tiled GEMMs; batch 17 (both combine apart) is the control.
TEST_CASE("MoE layer: the down GEMM's combine gives LaunchMoeCombine's bits", "[gpu][moe]") {
  GPU_TEST_RNG(rng);
  Ops o;
  for (const WeightQuant quant : {WeightQuant::kBf16, WeightQuant::kFp8PerTensor}) {
    for (const bool v3 : {false, true}) {
      INFO(WeightQuantName(quant) << (v3 ? " v3 routing" : " v2 routing"));
      TestMoe m;
      m.routing = v3 ? V3Routing(16, 4) : V2Routing(16, 4);
      MakeMoe(o.ops, quant, rng, &m);
      for (const bool shared : {true, false}) {
        for (const bool gemv : {true, false}) {
          INFO((shared ? "shared experts" : "no shared experts") << (gemv ? ", GEMVs" : ", tiles"));
          CudaMoeWeights& w = m.gpu;
          const int SI = w.shared.inter;
          if (!shared) w.shared.inter = 0;  // the same routed experts alone
          CudaMoeLayer fused(m.routing, m.hidden, m.inter, shared ? m.shared_inter : 0);
          fused.set_gemv_max_tokens(gemv ? cuda::kMoeGemvMaxTokens : 0);
          CudaMoeLayer separate = fused;
          separate.set_fused_combine_max_tokens(0);
          for (const int T : {1, 5, 16, 17}) {
            INFO("batch " << T);
            CHECK(fused.UsesFusedCombine(T) == (T <= cuda::kMoeFusedCombineMaxTokens));
            CHECK(!separate.UsesFusedCombine(T));
            std::normal_distribution<float> nd(0.f, 1.f);
            std::vector<float> x(static_cast<size_t>(T) * m.hidden);
            for (float& v : x) v = RoundBf16(nd(rng));
            CudaMoeScratch s1, s2;
            const std::vector<float> a = RunGpu(o, fused, w, m.hidden, x, T, &s1);
            const std::vector<float> b = RunGpu(o, separate, w, m.hidden, x, T, &s2);
            CHECK(fused.UsesGemv(T, w) == (gemv && T <= 16));
            REQUIRE(a == b);
            CHECK(std::any_of(a.begin(), a.end(), [](float v) { return v != 0.f; }));
          }
          w.shared.inter = SI;
        }
      }
    }
  }
}

// fp8 experts (one per-tensor scale per expert, CudaLinear::Quantize) with fp8 activations
// (moe_activation_dtype fp8: every batch; auto's choice per batch is the next test's): the
// W8A8 GEMMs with tiles of 16 (T 1, 7), 32 (T 64) and 64 rows (T 300: MoeMxfp4TileRows), the
// shared experts as their dense group, and the large-batch path's per-expert cuBLASLt GEMMs
// (forced from one token: an expert of one row runs a 16-row GEMM into the slack; by default from
// 64 slots per expert, T 300 here), against CpuMoe; and what the option refuses or leaves.
TEST_CASE("MoE layer with fp8 activations (W8A8) matches CpuMoe, batch 1..300", "[gpu][moe][fp8]") {
  GPU_TEST_RNG(rng);
  Ops o;
  using A = CudaMoeLayer::ActivationDtype;
  for (const bool v3 : {false, true}) {
    for (const int large_from : {INT_MAX, 0, CudaMoeLayer::kLargeBatchSlotsPerExpert}) {
      INFO((v3 ? "v3 routing" : "v2 routing") << ", large batch from " << large_from);
      TestMoe m;
      m.routing = v3 ? V3Routing(16, 4) : V2Routing(16, 4);
      MakeMoe(o.ops, WeightQuant::kFp8PerTensor, rng, &m);
      CudaMoeLayer layer(m.routing, m.hidden, m.inter, m.shared_inter);
      layer.set_activation_dtype(A::kFp8);
      layer.set_large_batch_slots_per_expert(large_from);
      REQUIRE(layer.ChooseActivations("test", &m.gpu).ok());
      REQUIRE(m.gpu.w8a8);
      CHECK(CudaMoeLayer::LargeBatchFp8Serves(m.gpu));
      CudaMoeScratch s;
      for (const int T : {1, 7, 64, 300}) {
        CHECK(layer.TakesLargeBatchPath(T, m.gpu) == (int64_t{T} * 4 >= int64_t{large_from} * 16));
        CheckAgainstCpu(o, layer, m.gpu, m.cpu, m.hidden, T, 1e-4f, rng, &s, kFp8ActBound,
                        kFp8ActMeanBound);
      }
    }
  }
  // bf16 experts: fp8 refuses them by name, auto keeps bf16 activations.
  {
    TestMoe m;
    m.routing = V3Routing(16, 4);
    MakeMoe(o.ops, WeightQuant::kBf16, rng, &m);
    CudaMoeLayer layer(m.routing, m.hidden, m.inter, m.shared_inter);
    layer.set_activation_dtype(A::kFp8);
    const Status st = layer.ChooseActivations("layer 3", &m.gpu);
    CHECK(!st.ok());
    CHECK(st.message() ==
          "moe_activation_dtype fp8, layer 3: the routed experts' weights are not fp8");
    layer.set_activation_dtype(A::kAuto);
    CHECK(layer.ChooseActivations("layer 3", &m.gpu).ok());
    CHECK(!m.gpu.w8a8);
  }
  // A hidden size the W8A8 GEMMs do not tile (192: not a multiple of 128).
  {
    TestMoe m;
    m.hidden = 192;
    m.routing = V3Routing(16, 4);
    MakeMoe(o.ops, WeightQuant::kFp8PerTensor, rng, &m);
    CudaMoeLayer layer(m.routing, m.hidden, m.inter, m.shared_inter);
    layer.set_activation_dtype(A::kFp8);
    const Status st = layer.ChooseActivations("layer 0", &m.gpu);
    CHECK(!st.ok());
    CHECK(st.message().find("multiples of 128") != std::string::npos);
    layer.set_activation_dtype(A::kAuto);
    CHECK(layer.ChooseActivations("layer 0", &m.gpu).ok());
    CHECK(!m.gpu.w8a8);
  }
}

// moe_activation_dtype auto on fp8 experts: bf16 activations (the W8A16 tiles, the GEMVs at one
// token) below CudaMoeLayer::kAutoW8a8MinTokens tokens, fp8 ones (the W8A8 tiles, the large-batch
// path's cuBLASLt GEMMs) from there: the same bits as either form, at the default threshold and at
// one moved down to where the tiles and the large-batch path (from 256 tokens here) both serve.
TEST_CASE("MoE layer with auto activations takes fp8 ones from kAutoW8a8MinTokens tokens",
          "[gpu][moe][fp8]") {
  GPU_TEST_RNG(rng);
  Ops o;
  using A = CudaMoeLayer::ActivationDtype;
  TestMoe m;
  m.routing = V2Routing(16, 4);
  MakeMoe(o.ops, WeightQuant::kFp8PerTensor, rng, &m);
  CudaMoeLayer fp8(m.routing, m.hidden, m.inter, m.shared_inter);
  fp8.set_activation_dtype(A::kFp8);
  CudaMoeLayer automatic(m.routing, m.hidden, m.inter, m.shared_inter);
  automatic.set_activation_dtype(A::kAuto);
  REQUIRE(automatic.ChooseActivations("test", &m.gpu).ok());
  REQUIRE(m.gpu.w8a8);
  constexpr int kMin = CudaMoeLayer::kAutoW8a8MinTokens;
  CHECK(!automatic.UsesW8a8(kMin - 1, m.gpu));
  CHECK(automatic.UsesW8a8(kMin, m.gpu));
  CHECK(fp8.UsesW8a8(1, m.gpu));
  std::normal_distribution<float> nd(0.f, 1.f);
  CudaMoeScratch s_auto, s_fp8, s_bf16;
  for (const int min_tokens : {kMin, 8}) {
    automatic.set_w8a8_min_tokens(min_tokens);
    const std::vector<int> batches =
        min_tokens == kMin ? std::vector<int>{1, kMin - 1, kMin} : std::vector<int>{1, 7, 8, 300};
    for (const int T : batches) {
      INFO("fp8 activations from " << min_tokens << " tokens, batch " << T);
      std::vector<float> x(static_cast<size_t>(T) * m.hidden);
      for (float& v : x) v = RoundBf16(nd(rng));
      const std::vector<float> got = RunGpu(o, automatic, m.gpu, m.hidden, x, T, &s_auto);
      const std::vector<float> with_fp8 = RunGpu(o, fp8, m.gpu, m.hidden, x, T, &s_fp8);
      m.gpu.w8a8 = false;  // what a bf16 load leaves: the W8A16 GEMMs
      const std::vector<float> with_bf16 = RunGpu(o, fp8, m.gpu, m.hidden, x, T, &s_bf16);
      m.gpu.w8a8 = true;
      CHECK(with_fp8 != with_bf16);
      CHECK(automatic.TakesLargeBatchPath(T, m.gpu) == (T >= min_tokens && T * 4 >= 64 * 16));
      CHECK(got == (T >= min_tokens ? with_fp8 : with_bf16));
    }
  }
}

// gpt-oss's block: router bias, softmax of the top-4 logits, stacked experts with biases, the
// clamped SwiGLU (limit 7; gate_up values spread wide enough that the clamp bites), no shared
// experts. The CPU oracle holds gate / up interleaved (row 2 i gate, 2 i + 1 up), as the
// checkpoint; the device's gate_up is gate rows then up rows (CudaMoeLayer::Load splits them).
TEST_CASE("MoE layer with gpt-oss's gate matches CpuMoe (biases, clamped SwiGLU)", "[gpu][moe]") {
  GPU_TEST_RNG(rng);
  Ops o;
  struct Shape {
    int K, H, I;
    std::vector<int> batches;
  };
  // Top-4 over hidden 256 / intermediate 128, and the top-2 shapes of issue 51's fidelity cases
  // (hidden 128 or 256, intermediate 64 or 256) at every batch a decode step with a prefill chunk
  // beside it produces.
  std::vector<int> every;
  for (int t = 1; t <= 70; ++t) every.push_back(t);
  const std::vector<Shape> shapes = {{4, 256, 128, {1, 7, 64, 200}},
                                     {2, 128, 64, every},
                                     {2, 128, 256, every},
                                     {2, 256, 64, every}};
  for (const Shape& shape : shapes) {
    const int E = 8, K = shape.K, H = shape.H, I = shape.I;
    INFO("top-" << K << " hidden " << H << " intermediate " << I);
    CpuMlp::Gate gate;
    gate.activation = CpuMlp::Activation::kClampedSwiGlu;
    const MoeRouting r = GptOssRouting(E, K);
    REQUIRE(CudaMoeLayer::Check(r, H, I, 0, gate).ok());
    std::normal_distribution<float> nd(0.f, 1.f);
    auto randv = [&](size_t n, float sd) {
      std::vector<float> v(n);
      for (float& x : v) x = RoundBf16(sd * nd(rng));
      return v;
    };
    for (const WeightQuant quant : {WeightQuant::kBf16, WeightQuant::kFp8PerTensor}) {
      INFO(WeightQuantName(quant));
      CpuMoe cpu;
      CudaMoeWeights gpu;
      cpu.routing = r;
      cpu.router = randv(static_cast<size_t>(E) * H, 0.1f);
      cpu.router_bias = randv(E, 0.5f);
      REQUIRE(gpu.router.Alloc(cpu.router.size() * 4).ok());
      CUDA_REQUIRE(cudaMemcpy(gpu.router.ptr, cpu.router.data(), cpu.router.size() * 4,
                              cudaMemcpyHostToDevice));
      REQUIRE(gpu.logit_bias.Alloc(E * 4).ok());
      CUDA_REQUIRE(
          cudaMemcpy(gpu.logit_bias.ptr, cpu.router_bias.data(), E * 4, cudaMemcpyHostToDevice));
      const std::vector<float> gu = randv(static_cast<size_t>(E) * 2 * I * H, 0.3f);  // split
      const std::vector<float> dn = randv(static_cast<size_t>(E) * H * I, 0.03f);
      const std::vector<float> gu_b = randv(static_cast<size_t>(E) * 2 * I, 0.5f);  // split
      const std::vector<float> dn_b = randv(static_cast<size_t>(E) * H, 0.2f);
      UploadLinear(o.ops, gu, quant, 2 * I, H, E, &gpu.gate_up);
      UploadLinear(o.ops, dn, quant, H, I, E, &gpu.down);
      REQUIRE(gpu.gate_up_bias.Alloc(gu_b.size() * 4).ok());
      CUDA_REQUIRE(
          cudaMemcpy(gpu.gate_up_bias.ptr, gu_b.data(), gu_b.size() * 4, cudaMemcpyHostToDevice));
      REQUIRE(gpu.down_bias.Alloc(dn_b.size() * 4).ok());
      CUDA_REQUIRE(
          cudaMemcpy(gpu.down_bias.ptr, dn_b.data(), dn_b.size() * 4, cudaMemcpyHostToDevice));
      const bool fp8 = quant != WeightQuant::kBf16;
      const std::vector<float> gu_ref = fp8 ? Dequant(gpu.gate_up, E, 2 * I, H) : gu;
      const std::vector<float> dn_ref = fp8 ? Dequant(gpu.down, E, H, I) : dn;
      cpu.experts.assign(E, CpuMlp());
      for (int e = 0; e < E; ++e) {
        CpuMlp& x = cpu.experts[e];
        x.hidden = H;
        x.intermediate = I;
        x.gate = gate;
        x.w_gate_up.resize(static_cast<size_t>(2) * I * H);
        x.b_gate_up.resize(2 * I);
        for (int i = 0; i < 2 * I; ++i) {  // device row i -> interleaved row
          const int dst = i < I ? 2 * i : 2 * (i - I) + 1;
          std::copy_n(gu_ref.begin() + (static_cast<size_t>(e) * 2 * I + i) * H, H,
                      x.w_gate_up.begin() + static_cast<size_t>(dst) * H);
          x.b_gate_up[dst] = gu_b[e * 2 * I + i];
        }
        x.w_down.assign(dn_ref.begin() + static_cast<size_t>(e) * H * I,
                        dn_ref.begin() + static_cast<size_t>(e + 1) * H * I);
        x.b_down.assign(dn_b.begin() + e * H, dn_b.begin() + (e + 1) * H);
      }
      // the tiled path (GEMVs up to 16 tokens), the tiled GEMMs alone, the large-batch path
      for (const int variant : {0, 1, 2}) {
        const int large_from = variant == 2 ? 0 : INT_MAX;
        INFO("large batch from " << large_from << " slots per expert, variant " << variant);
        CudaMoeLayer layer(r, H, I, 0, gate);
        layer.set_large_batch_slots_per_expert(large_from);
        layer.set_gemv_max_tokens(variant == 1 ? 0 : cuda::kMoeGemvMaxTokens);
        CudaMoeScratch s;
        for (const int T : shape.batches) {
          CheckAgainstCpu(o, layer, gpu, cpu, H, T, 1e-3f, rng, &s);  // margins in logits units
        }
      }
    }
  }
}

// A pre-quantized checkpoint's experts kept as stored (CudaMoeLayer::Load with fp8_checkpoint,
// no bf16 copy): 128x128 blocks (DeepSeek-V3's weight_scale_inv), per channel (compressed-
// tensors) and per tensor with static input scales (ModelOpt: every expert's own scale, so the
// stack has per-row scales), routed and shared experts, against CpuMoe on the same checkpoint
// as WeightStore::ReadF32 dequantizes it.
TEST_CASE("MoE layer keeps a checkpoint's fp8 experts and matches CpuMoe on them",
          "[gpu][moe][fp8]") {
  namespace fs = std::filesystem;
  using gpu_test::Fp8Format;
  GPU_TEST_RNG(rng);
  Ops o;
  const int E = 16, K = 4, H = 256, I = 128, SI = 256;
  // The static input_scale of every projection (ModelOpt), as calibration would choose it: e4m3's
  // range at it (448 x 0.125 = 56) stays above every GEMM input of these random rows, so no value
  // saturates (the CPU oracle keeps fp32 and never clips). At 0.05 (22.4 at most) the gated
  // activations of a few tokens clipped in about one run in six (relative errors up to 0.26).
  constexpr float kInputScale = 0.125f;
  const std::string p = "model.layers.0.mlp.";
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const Fp8Format f : {Fp8Format::kBlock128, Fp8Format::kCtChannel, Fp8Format::kModelOpt}) {
    INFO(gpu_test::Fp8FormatName(f));
    const fs::path dir =
        fs::temp_directory_path() / ("llm_gpu_moe_fp8_" + std::to_string(static_cast<int>(f)));
    fs::create_directories(dir);
    std::vector<TensorToWrite> ts;
    std::vector<float> router(static_cast<size_t>(E) * H), bias(E);
    for (float& v : router) v = RoundBf16(0.1f * nd(rng));  // the device widens its bf16
    for (float& v : bias) v = 0.05f * nd(rng);
    ts.push_back(gpu_test::F32Tensor(p + "gate.weight", {E, H}, router));
    ts.push_back(gpu_test::F32Tensor(p + "gate.e_score_correction_bias", {E}, bias));
    auto linear = [&](const std::string& stem, int64_t rows, int64_t cols) {
      std::vector<float> w(static_cast<size_t>(rows * cols));
      const float sd = 1.0f / std::sqrt(static_cast<float>(cols));
      for (int64_t r = 0; r < rows; ++r) {  // rows of different magnitude
        const float g = 0.5f + static_cast<float>(r % 7) / 6.f;
        for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = g * sd * nd(rng);
      }
      gpu_test::AddFp8Linear(&ts, stem, f, rows, cols, w, kInputScale);
    };
    auto mlp = [&](const std::string& q, int inter) {
      linear(q + "gate_proj", inter, H);
      linear(q + "up_proj", inter, H);
      linear(q + "down_proj", H, inter);
    };
    for (int e = 0; e < E; ++e) mlp(p + "experts." + std::to_string(e) + ".", I);
    mlp(p + "shared_experts.", SI);
    REQUIRE(WriteSafetensors((dir / "model.safetensors").string(), ts).ok());
    auto store = WeightStore::Open(dir.string());
    REQUIRE(store.ok());
    WeightQuantization q;
    REQUIRE(ReadQuantizationConfig(
                nlohmann::json{{"quantization_config", gpu_test::Fp8QuantizationConfig(f)}},
                "config.json", &q)
                .ok());
    (*store)->set_quantization(q);
    const WeightStore& ws = **store;

    const MoeRouting routing = V3Routing(E, K);
    MoeTensorNames names;
    names.selection_bias = "e_score_correction_bias";
    CudaMoeLayer layer(routing, H, I, SI);
    layer.set_gemv_max_tokens(cuda::kMoeGemvMaxTokens);  // batch 7 too
    Bf16WeightLoader loader(&ws, o.stream);
    CudaMoeWeights gpu;
    REQUIRE(layer
                .Load(loader, &ws, o.ops, WeightQuant::kBf16, p, names, &gpu,
                      /*fp8_checkpoint=*/true)
                .ok());
    // Stacking tensors of their own scales gives per-row scales; the shared experts' down
    // projection is one tensor, so a per-tensor checkpoint (ModelOpt) keeps its one scale.
    const WeightQuant want =
        f == Fp8Format::kBlock128 ? WeightQuant::kFp8Block : WeightQuant::kFp8PerChannel;
    for (const CudaLinear* l : {&gpu.gate_up, &gpu.down, &gpu.shared.gate_up}) {
      CHECK(l->quant() == want);
    }
    CHECK(gpu.shared.down.quant() ==
          (f == Fp8Format::kModelOpt ? WeightQuant::kFp8PerTensor : want));
    // The e4m3 bytes themselves: one byte per weight, no bf16 matrix.
    CHECK(gpu.gate_up.weight_bytes() == static_cast<size_t>(E) * 2 * I * H);
    CHECK(gpu.down.weight_bytes() == static_cast<size_t>(E) * H * I);
    CHECK(gpu.shared.gate_up.weight_bytes() == static_cast<size_t>(2) * SI * H);

    CpuMoe cpu;
    cpu.routing = routing;
    cpu.router = router;
    cpu.selection_bias = bias;
    auto read_mlp = [&](const std::string& q, int inter, CpuMlp* m) {
      std::vector<float> g, u;
      m->hidden = H;
      m->intermediate = inter;
      REQUIRE(ws.ReadF32(q + "gate_proj.weight", {inter, H}, &g).ok());
      REQUIRE(ws.ReadF32(q + "up_proj.weight", {inter, H}, &u).ok());
      REQUIRE(ws.ReadF32(q + "down_proj.weight", {H, inter}, &m->w_down).ok());
      m->w_gate_up = g;
      m->w_gate_up.insert(m->w_gate_up.end(), u.begin(), u.end());
    };
    cpu.experts.assign(E, CpuMlp());
    for (int e = 0; e < E; ++e)
      read_mlp(p + "experts." + std::to_string(e) + ".", I, &cpu.experts[e]);
    read_mlp(p + "shared_experts.", SI, &cpu.shared);
    CudaMoeScratch s;
    // T 1 and 7 through the fp8 GEMVs (each format's scales, the shared experts' dense group),
    // then through the tiled GEMMs; 64 and 300 tiled.
    CHECK(layer.UsesGemv(7, gpu));
    CHECK(!layer.UsesGemv(64, gpu));
    for (const int T : {1, 7, 64, 300}) CheckAgainstCpu(o, layer, gpu, cpu, H, T, 1e-4f, rng, &s);
    {
      CudaMoeLayer tiled = layer;
      tiled.set_gemv_max_tokens(0);
      for (const int T : {1, 7}) CheckAgainstCpu(o, tiled, gpu, cpu, H, T, 1e-4f, rng, &s);
    }
    // The same experts with fp8 activations (W8A8): per token and 128-wide group beside the
    // blocks, per token beside per-row scales; tiles of 16 (T 1, 7), 32 (T 64) and 64 rows.
    {
      CudaMoeLayer layer8(routing, H, I, SI);
      layer8.set_activation_dtype(CudaMoeLayer::ActivationDtype::kFp8);
      layer8.set_large_batch_slots_per_expert(INT_MAX);  // the tiles (the large path: below)
      Bf16WeightLoader loader8(&ws, o.stream);
      CudaMoeWeights gpu8;
      const Status st = layer8.Load(loader8, &ws, o.ops, WeightQuant::kBf16, p, names, &gpu8,
                                    /*fp8_checkpoint=*/true);
      INFO(st.message());
      REQUIRE(st.ok());
      CHECK(gpu8.w8a8);
      CudaMoeScratch s8;
      for (const int T : {1, 7, 64, 300}) {
        INFO("fp8 activations");
        CheckAgainstCpu(o, layer8, gpu8, cpu, H, T, 1e-4f, rng, &s8, kFp8ActBound,
                        kFp8ActMeanBound);
      }
      // ModelOpt's static input_scale (kInputScale on every projection) quantized every GEMM input
      // of the last run (300 tokens, 1200 slots); the other formats' scales are dynamic.
      const int T = 300, S = T * K;
      const std::vector<float> xs = Download(s8.xq_scale.as<float>(), T);
      const std::vector<float> as = Download(s8.actq_scale.as<float>(), S);
      const std::vector<float> sas = Download(s8.shared_actq_scale.as<float>(), T);
      const bool static_scales = f == Fp8Format::kModelOpt;
      CHECK((xs == std::vector<float>(T, kInputScale)) == static_scales);
      CHECK((as == std::vector<float>(S, kInputScale)) == static_scales);
      CHECK((sas == std::vector<float>(T, kInputScale)) == static_scales);
      if (static_scales) {
        CHECK(Download(s8.shared_xq_scale.as<float>(), T) == std::vector<float>(T, kInputScale));
      }
      // The large-batch path (forced from one token): per-expert cuBLASLt GEMMs with the rows'
      // scales beside per-channel weights (kOuter), with 1x128 row blocks beside 128x128 weight
      // blocks (each expert's scales a matrix of its own), the ModelOpt shared down projection's
      // one scale through its Apply.
      layer8.set_large_batch_slots_per_expert(0);
      CHECK(CudaMoeLayer::LargeBatchFp8Serves(gpu8));
      CudaMoeScratch sl;
      for (const int T2 : {1, 64, 300}) {
        INFO("fp8 activations, large-batch path, T " << T2);
        CHECK(layer8.TakesLargeBatchPath(T2, gpu8));
        CheckAgainstCpu(o, layer8, gpu8, cpu, H, T2, 1e-4f, rng, &sl, kFp8ActBound,
                        kFp8ActMeanBound);
      }
      // The last quantization was the shared down projection's input: T rows at its static
      // scale under ModelOpt.
      if (static_scales) {
        CHECK(Download(sl.large_q_scale.as<float>(), T) == std::vector<float>(T, kInputScale));
      }
    }
    fs::remove_all(dir);
  }
  // Block scales need whole 128-row blocks where gate and up (and the experts) are stacked.
  {
    const fs::path dir = fs::temp_directory_path() / "llm_gpu_moe_fp8_refused";
    fs::create_directories(dir);
    std::vector<TensorToWrite> ts;
    const int Er = 4, Ir = 64;
    ts.push_back(gpu_test::F32Tensor(p + "gate.weight", {Er, H},
                                     std::vector<float>(static_cast<size_t>(Er) * H, 0.f)));
    for (int e = 0; e < Er; ++e) {
      const std::string q = p + "experts." + std::to_string(e) + ".";
      const std::vector<float> w(static_cast<size_t>(Ir) * H, 0.01f);
      gpu_test::AddFp8Linear(&ts, q + "gate_proj", Fp8Format::kBlock128, Ir, H, w, 0.f);
      gpu_test::AddFp8Linear(&ts, q + "up_proj", Fp8Format::kBlock128, Ir, H, w, 0.f);
      gpu_test::AddFp8Linear(&ts, q + "down_proj", Fp8Format::kBlock128, H, Ir, w, 0.f);
    }
    REQUIRE(WriteSafetensors((dir / "model.safetensors").string(), ts).ok());
    auto store = WeightStore::Open(dir.string());
    REQUIRE(store.ok());
    WeightQuantization q;
    REQUIRE(ReadQuantizationConfig(
                nlohmann::json{
                    {"quantization_config", gpu_test::Fp8QuantizationConfig(Fp8Format::kBlock128)}},
                "config.json", &q)
                .ok());
    (*store)->set_quantization(q);
    MoeRouting r = GptOssRouting(Er, 2);
    r.scoring = MoeRouting::Scoring::kSoftmax;
    CudaMoeLayer layer(r, H, Ir, 0);
    Bf16WeightLoader loader(store->get(), o.stream);
    CudaMoeWeights gpu;
    const Status st = layer.Load(loader, store->get(), o.ops, WeightQuant::kBf16, p,
                                 MoeTensorNames{}, &gpu, /*fp8_checkpoint=*/true);
    INFO(st.message());
    CHECK(!st.ok());
    CHECK(st.message().find("experts.0.gate_proj.weight has 64 rows, not whole 128-row blocks") !=
          std::string::npos);
    fs::remove_all(dir);
  }
}

// bf16 experts through the fused routing at batch 1, 7 and 16 (its ticket, and the down GEMM's
// combine tickets, must be back at zero after every launch, or the next replay would route or
// combine nothing) and through cuBLAS + the routing kernels at 7; fp8 experts with fp8
// activations (the W8A8 GEMMs and their quantization kernels inside the graph) at 7 and 16.
TEST_CASE("MoE layer in a CUDA graph replays like eager runs", "[gpu][moe]") {
  GPU_TEST_RNG(rng);
  Ops o;
  struct Case {
    int T;
    bool fused;
    bool w8a8;
    bool gemv = true;  // bf16 experts: the GEMVs (cuda::LaunchMoeGemv), else the tiled GEMMs
  };
  for (const Case c :
       {Case{1, true, false}, Case{7, true, false}, Case{16, true, false}, Case{7, false, false},
        Case{7, true, true}, Case{16, false, true}, Case{7, true, false, false}}) {
    const int T = c.T;
    const bool w8a8 = c.w8a8;
    INFO("batch " << T << (c.fused ? ", fused routing" : ", unfused routing")
                  << (w8a8 ? ", fp8 experts, fp8 activations" : ", bf16 experts")
                  << (c.gemv ? "" : ", tiled GEMMs"));
    TestMoe m;
    m.routing = V3Routing(16, 4);
    m.hidden = 1024;  // the fused routing's grid: 4 column slices, so 4 CTAs draw tickets
    MakeMoe(o.ops, w8a8 ? WeightQuant::kFp8PerTensor : WeightQuant::kBf16, rng, &m);
    const int H = m.hidden;
    CudaMoeLayer layer(m.routing, m.hidden, m.inter, m.shared_inter);
    if (!c.fused) layer.set_fused_route_max_tokens(0);
    layer.set_gemv_max_tokens(c.gemv ? cuda::kMoeGemvMaxTokens : 0);
    if (w8a8) layer.set_activation_dtype(CudaMoeLayer::ActivationDtype::kFp8);
    REQUIRE(layer.ChooseActivations("test", &m.gpu).ok());
    REQUIRE(m.gpu.w8a8 == w8a8);
    REQUIRE(layer.UsesGemv(T, m.gpu) == (c.gemv && !w8a8));
    REQUIRE(layer.UsesFusedRoute(T) == c.fused);
    REQUIRE(layer.graph_safe());
    CudaMoeScratch s;
    REQUIRE(layer.Reserve(T, &s).ok());
    DeviceBuffer d_x, d_out;
    REQUIRE(d_x.Alloc(static_cast<size_t>(T) * H * 2).ok());
    REQUIRE(d_out.Alloc(static_cast<size_t>(T) * H * 2).ok());
    std::normal_distribution<float> nd(0.f, 1.f);
    auto set_input = [&](std::vector<float>* x) {
      x->resize(static_cast<size_t>(T) * H);
      std::vector<uint16_t> xb(x->size());
      for (size_t i = 0; i < x->size(); ++i) xb[i] = F32ToBf16((*x)[i] = RoundBf16(nd(rng)));
      CUDA_REQUIRE(
          cudaMemcpyAsync(d_x.ptr, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice, o.stream));
      CUDA_REQUIRE(
          cudaMemcpyAsync(s.x_f32.ptr, x->data(), x->size() * 4, cudaMemcpyHostToDevice, o.stream));
      CUDA_REQUIRE(cudaStreamSynchronize(o.stream));
    };
    auto output = [&] {
      CUDA_REQUIRE(cudaStreamSynchronize(o.stream));
      return Download(d_out.as<uint16_t>(), static_cast<size_t>(T) * H);
    };
    auto tickets_zero = [&] {  // the routing's and the down GEMM's combine's
      std::vector<uint32_t> t =
          Download(s.combine_tickets.as<uint32_t>(), s.combine_tickets.bytes / 4);
      t.push_back(Download(s.route_ticket.as<uint32_t>(), 1)[0]);
      return std::all_of(t.begin(), t.end(), [](uint32_t v) { return v == 0; });
    };
    std::vector<float> x;
    set_input(&x);
    REQUIRE(layer.Run(o.ops, m.gpu, d_x.ptr, T, &s, d_out.ptr, {}).ok());  // warm-up
    cudaGraph_t graph;
    CUDA_REQUIRE(cudaStreamBeginCapture(o.stream, cudaStreamCaptureModeThreadLocal));
    REQUIRE(layer.Run(o.ops, m.gpu, d_x.ptr, T, &s, d_out.ptr, {}).ok());
    // A trace inside a capture is refused, not silently skipped.
    std::vector<MoeRoutingDecision> trace;
    std::vector<int32_t> pos(T, 0);
    const Status traced =
        layer.Run(o.ops, m.gpu, d_x.ptr, T, &s, d_out.ptr, {&trace, 0, pos.data()});
    CUDA_REQUIRE(cudaStreamEndCapture(o.stream, &graph));
    REQUIRE(!traced.ok());
    cudaGraphExec_t exec;
    CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 4; ++round) {
      INFO("round " << round);
      set_input(&x);
      CUDA_REQUIRE(cudaGraphLaunch(exec, o.stream));
      if (round % 2 == 1) CUDA_REQUIRE(cudaGraphLaunch(exec, o.stream));  // back to back
      const std::vector<uint16_t> replayed = output();
      CHECK(tickets_zero());
      REQUIRE(layer.Run(o.ops, m.gpu, d_x.ptr, T, &s, d_out.ptr, {}).ok());
      const std::vector<uint16_t> eager = output();
      CHECK(tickets_zero());
      REQUIRE(replayed == eager);
      std::vector<float> ref(x.size());
      m.cpu.Forward(x.data(), T, {}, ref.data());
      double d2 = 0, r2 = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double d = Bf16ToF32(eager[i]) - ref[i];
        d2 += d * d;
        r2 += static_cast<double>(ref[i]) * ref[i];
      }
      // and the inputs changed the output
      CHECK(std::sqrt(d2) <= (w8a8 ? kFp8ActBound : kBf16ActBound) * std::sqrt(r2));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

}  // namespace
}  // namespace llm
