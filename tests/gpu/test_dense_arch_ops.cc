// The kernel options the dense architectures beyond Llama add to
// kernels/cuda/ops/elementwise_ops.h, against a host computation of the same definition: the
// per-head q/k RMSNorm before rotary (Qwen3, Gemma 3), the (1 + w) norm weights and the post-branch
// norm of the residual delta (Gemma), GeGLU with tanh GELU, and the logit soft-cap.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cuda/ops/elementwise_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

std::vector<uint16_t> Bf16s(size_t n, std::mt19937& rng, float mean, float std) {
  std::normal_distribution<float> nd(mean, std);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = F32ToBf16(nd(rng));
  return v;
}

// Within one bf16 rounding step of the value (fp32 sums differ in order host / device).
int CountFar(const std::vector<uint16_t>& got, const std::vector<float>& want, float rel) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = Bf16ToF32(got[i]);
    bad += !(std::fabs(g - want[i]) <= 1e-4f + std::fabs(want[i]) * rel);
  }
  return bad;
}

TEST_CASE("Dense arch ops: q/k RMSNorm before rotary matches the host", "[gpu][ops]") {
  GPU_TEST_RNG(rng);
  const int T = 3, hq = 4, hkv = 2;
  for (int D : {64, 128, 256}) {
    for (float offset : {0.f, 1.f}) {
      for (bool with_bias : {false, true}) {
        INFO("D " << D << " offset " << offset << " bias " << with_bias);
        const int heads = hq + 2 * hkv, width = heads * D, half = D / 2;
        const auto qkv = Bf16s(static_cast<size_t>(T) * width, rng, 0.f, 2.f);
        const auto bias = Bf16s(width, rng, 0.f, 0.5f);
        const auto qn = Bf16s(D, rng, 1.f - offset, 0.2f), kn = Bf16s(D, rng, 1.f - offset, 0.2f);
        const std::vector<int32_t> pos = {0, 7, 300};
        std::vector<float> inv(half);
        for (int i = 0; i < half; ++i) inv[i] = std::pow(10000.f, -2.f * i / D);
        uint16_t* d_qkv = Upload(qkv);
        uint16_t* d_bias = Upload(bias);
        uint16_t* d_qn = Upload(qn);
        uint16_t* d_kn = Upload(kn);
        int32_t* d_pos = Upload(pos);
        float* d_inv = Upload(inv);
        void *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;
        CUDA_REQUIRE(cudaMalloc(&d_q, static_cast<size_t>(T) * hq * D * 2));
        CUDA_REQUIRE(cudaMalloc(&d_k, static_cast<size_t>(T) * hkv * D * 2));
        CUDA_REQUIRE(cudaMalloc(&d_v, static_cast<size_t>(T) * hkv * D * 2));
        RopeArgs a;
        a.qkv = d_qkv;
        a.bias = with_bias ? d_bias : nullptr;
        a.positions = d_pos;
        a.inv_freq = d_inv;
        a.q = d_q;
        a.k = d_k;
        a.v = d_v;
        a.num_tokens = T;
        a.num_q_heads = hq;
        a.num_kv_heads = hkv;
        a.head_dim = D;
        a.q_norm = d_qn;
        a.k_norm = d_kn;
        a.norm_eps = 1e-6f;
        a.norm_offset = offset;
        LaunchBiasRope(a, nullptr);
        CUDA_REQUIRE(cudaDeviceSynchronize());
        std::vector<float> want_q(static_cast<size_t>(T) * hq * D),
            want_k(static_cast<size_t>(T) * hkv * D), want_v(want_k.size());
        for (int t = 0; t < T; ++t) {
          for (int h = 0; h < heads; ++h) {
            std::vector<float> x(D);
            double ss = 0;
            for (int i = 0; i < D; ++i) {
              const size_t c = static_cast<size_t>(h) * D + i;
              x[i] = Bf16ToF32(qkv[static_cast<size_t>(t) * width + c]) +
                     (with_bias ? Bf16ToF32(bias[c]) : 0.f);
              ss += static_cast<double>(x[i]) * x[i];
            }
            float* dst = h < hq ? &want_q[(static_cast<size_t>(t) * hq + h) * D]
                         : h < hq + hkv
                             ? &want_k[(static_cast<size_t>(t) * hkv + h - hq) * D]
                             : &want_v[(static_cast<size_t>(t) * hkv + h - hq - hkv) * D];
            if (h >= hq + hkv) {
              for (int i = 0; i < D; ++i) dst[i] = x[i];
              continue;
            }
            const auto& w = h < hq ? qn : kn;
            const float r = 1.f / std::sqrt(static_cast<float>(ss / D) + 1e-6f);
            for (int i = 0; i < D; ++i) x[i] *= r * (offset + Bf16ToF32(w[i]));
            for (int i = 0; i < half; ++i) {
              const float ang = static_cast<float>(pos[t]) * inv[i];
              const float c = std::cos(ang), s = std::sin(ang);
              dst[i] = x[i] * c - x[i + half] * s;
              dst[i + half] = x[i + half] * c + x[i] * s;
            }
          }
        }
        CHECK(CountFar(Download(static_cast<uint16_t*>(d_q), want_q.size()), want_q, 1.f / 64) ==
              0);
        CHECK(CountFar(Download(static_cast<uint16_t*>(d_k), want_k.size()), want_k, 1.f / 64) ==
              0);
        CHECK(CountFar(Download(static_cast<uint16_t*>(d_v), want_v.size()), want_v, 1.f / 128) ==
              0);
        for (void* p : {static_cast<void*>(d_qkv), static_cast<void*>(d_bias),
                        static_cast<void*>(d_qn), static_cast<void*>(d_kn),
                        static_cast<void*>(d_pos), static_cast<void*>(d_inv), d_q, d_k, d_v}) {
          cudaFree(p);
        }
      }
    }
  }
}

TEST_CASE("Dense arch ops: post-branch norm, (1 + w) weights, GeGLU and soft-cap match the host",
          "[gpu][ops]") {
  GPU_TEST_RNG(rng);
  // 256: the register kernels; 1001: the scalar fallback.
  for (int hidden : {256, 1001}) {
    INFO("hidden " << hidden);
    const int T = 5;
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> res(static_cast<size_t>(T) * hidden);
    for (auto& x : res) x = nd(rng);
    const auto delta = Bf16s(res.size(), rng, 0.f, 5.f);
    const auto dn = Bf16s(hidden, rng, 0.f, 0.2f), w = Bf16s(hidden, rng, 0.f, 0.2f);
    float* d_res = Upload(res);
    uint16_t* d_delta = Upload(delta);
    uint16_t* d_dn = Upload(dn);
    uint16_t* d_w = Upload(w);
    void* d_out = nullptr;
    CUDA_REQUIRE(cudaMalloc(&d_out, res.size() * 2));
    RmsNormArgs a;
    a.residual = d_res;
    a.delta = d_delta;
    a.delta_norm = d_dn;
    a.weight = d_w;
    a.weight_offset = 1.f;
    a.num_rows = T;
    a.hidden = hidden;
    a.eps = 1e-6f;
    a.out = d_out;
    LaunchAddRmsNorm(a, nullptr);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    std::vector<float> want_res = res, want_out(res.size());
    for (int t = 0; t < T; ++t) {
      const size_t o = static_cast<size_t>(t) * hidden;
      double dss = 0, ss = 0;
      for (int i = 0; i < hidden; ++i) {
        const double d = Bf16ToF32(delta[o + i]);
        dss += d * d;
      }
      const float dr = 1.f / std::sqrt(static_cast<float>(dss / hidden) + 1e-6f);
      for (int i = 0; i < hidden; ++i) {
        want_res[o + i] += Bf16ToF32(delta[o + i]) * dr * (1.f + Bf16ToF32(dn[i]));
        ss += static_cast<double>(want_res[o + i]) * want_res[o + i];
      }
      const float r = 1.f / std::sqrt(static_cast<float>(ss / hidden) + 1e-6f);
      for (int i = 0; i < hidden; ++i) {
        want_out[o + i] = want_res[o + i] * r * (1.f + Bf16ToF32(w[i]));
      }
    }
    const auto got_res = Download(d_res, res.size());
    int far = 0;
    for (size_t i = 0; i < res.size(); ++i) {
      far += std::fabs(got_res[i] - want_res[i]) > 1e-5f * (1.f + std::fabs(want_res[i]));
    }
    CHECK(far == 0);
    CHECK(CountFar(Download(static_cast<uint16_t*>(d_out), want_out.size()), want_out, 1.f / 64) ==
          0);
    for (void* p : {static_cast<void*>(d_res), static_cast<void*>(d_delta),
                    static_cast<void*>(d_dn), static_cast<void*>(d_w), d_out}) {
      cudaFree(p);
    }
  }
  for (int inter : {512, 1001}) {
    INFO("gelu inter " << inter);
    const int T = 4;
    const auto gu = Bf16s(static_cast<size_t>(T) * 2 * inter, rng, 0.f, 2.f);
    uint16_t* d_gu = Upload(gu);
    void* d_act = nullptr;
    CUDA_REQUIRE(cudaMalloc(&d_act, static_cast<size_t>(T) * inter * 2));
    SiluMulArgs a;
    a.gate_up = d_gu;
    a.num_tokens = T;
    a.inter = inter;
    a.gelu_tanh = true;
    a.act = d_act;
    LaunchSiluMul(a, nullptr);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    std::vector<float> want(static_cast<size_t>(T) * inter);
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < inter; ++i) {
        const double x = Bf16ToF32(gu[static_cast<size_t>(t) * 2 * inter + i]);
        const double up = Bf16ToF32(gu[static_cast<size_t>(t) * 2 * inter + inter + i]);
        const double g =
            0.5 * x *
            (1 + std::tanh(std::sqrt(2 / 3.141592653589793) * (x + 0.044715 * x * x * x)));
        want[static_cast<size_t>(t) * inter + i] = static_cast<float>(g * up);
      }
    }
    CHECK(CountFar(Download(static_cast<uint16_t*>(d_act), want.size()), want, 1.f / 64) == 0);
    cudaFree(d_gu);
    cudaFree(d_act);
  }
  std::vector<float> logits(3000);
  std::normal_distribution<float> wide(0.f, 40.f);
  for (auto& x : logits) x = wide(rng);
  float* d_l = Upload(logits);
  LaunchSoftCap(d_l, static_cast<int64_t>(logits.size()), 30.f, nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const auto got = Download(d_l, logits.size());
  int far = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    far += std::fabs(got[i] - 30.f * std::tanh(logits[i] / 30.f)) > 1e-4f;
  }
  CHECK(far == 0);
  cudaFree(d_l);
}

}  // namespace
}  // namespace llm::cuda
