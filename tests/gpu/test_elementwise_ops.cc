// The Llama element-wise kernels (kernels/cuda/ops/elementwise_ops.h) against a host computation of
// the same definition, on shapes that take the vectorized paths (multiples of 8) and the scalar
// fallbacks (odd widths), with and without the residual delta (and its projection's bias) and the
// row gather, and with bf16 or fp8 (e4m3 rows with one scale each, the input of an fp8 GEMM)
// outputs and row-scaled inputs.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/cuda/ops/elementwise_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = F32ToBf16(nd(rng));
  return v;
}

// bf16 outputs: equal up to one bf16 rounding step of the value (the fp32 sums may differ in
// order between the host loop and the device reduction).
void CheckBf16Close(const std::vector<uint16_t>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = Bf16ToF32(got[i]);
    if (!(std::fabs(g - want[i]) <= 1e-5f + std::fabs(want[i]) * (1.f / 128))) ++bad;
  }
  CHECK(bad == 0);
}

// fp8 rows (fp8_quant.h Fp8Rows) against the fp32 host values `want` [rows, cols]: each row's
// scale is its absmax / 448 (quant.h DynamicScale) up to fp32 summation order, and each byte is
// the host quantization of the same value with the device's scale, give or take one e4m3 step
// for values on a rounding boundary (the host and the device sum squares in different orders),
// which at most 1% of the bytes may be.
void CheckFp8Rows(const std::vector<uint8_t>& q, const std::vector<float>& scales,
                  const std::vector<float>& want, int cols) {
  const size_t rows = scales.size();
  REQUIRE(q.size() == rows * cols);
  REQUIRE(want.size() == q.size());
  size_t far = 0, off_by_one = 0;
  for (size_t r = 0; r < rows; ++r) {
    float amax = 0.f;
    for (int i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(want[r * cols + i]));
    const float host_scale = DynamicScale(amax, kFp8E4M3Max);
    INFO("row " << r << " scale " << scales[r] << " host " << host_scale);
    CHECK(std::fabs(scales[r] - host_scale) <= 1e-5f * host_scale);
    for (int i = 0; i < cols; ++i) {
      const uint8_t h = QuantizeFp8(want[r * cols + i], scales[r]), g = q[r * cols + i];
      if (h == g) continue;
      // e4m3 magnitudes order like their 7-bit codes; zero may carry either sign.
      const int dh = h & 0x7f, dg = g & 0x7f;
      const bool same_sign = (h & 0x80) == (g & 0x80) || dh == 0 || dg == 0;
      if (same_sign && std::abs(dh - dg) == 1) {
        ++off_by_one;
      } else {
        ++far;
      }
    }
  }
  CHECK(far == 0);
  CHECK(off_by_one <= q.size() / 100);
}

std::vector<float> RandomRowScales(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.25f, 4.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST_CASE("Llama ops: add + RMSNorm and SiluMul match the host definition", "[gpu][ops]") {
  GPU_TEST_RNG(rng);
  for (int hidden : {256, 4096, 4100, 8192, 8200}) {
    for (int T : {1, 3, 17}) {
      for (int variant = 0; variant < 10; ++variant) {
        // delta: none, bf16, bf16 + bias, an fp8 GEMM's raw output with row scales, the same +
        // bias (added after the scale); output bf16 or fp8.
        const int kind = variant % 5;
        const bool with_delta = kind != 0, scaled_delta = kind >= 3;
        const bool biased = kind == 2 || kind == 4;
        const bool fp8 = variant >= 5;
        for (bool gather : {false, true}) {
          INFO("hidden " << hidden << " T " << T << " delta " << with_delta << " scaled "
                         << scaled_delta << " bias " << biased << " fp8 " << fp8 << " gather "
                         << gather);
          std::normal_distribution<float> nd(0.f, 2.f);
          std::vector<float> res(static_cast<size_t>(T) * hidden);
          for (auto& x : res) x = nd(rng);
          const auto delta = RandomBf16(res.size(), rng);
          const auto delta_scale = RandomRowScales(T, rng);
          const auto weight = RandomBf16(hidden, rng, 1.f);
          const auto bias = RandomBf16(hidden, rng);
          std::vector<int32_t> rows;
          for (int t = T - 1; t >= 0; t -= 2) rows.push_back(t);  // reversed, every other row
          const int R = gather ? static_cast<int>(rows.size()) : T;
          float* d_res = Upload(res);
          uint16_t* d_delta = Upload(delta);
          float* d_ds = Upload(delta_scale);
          uint16_t* d_w = Upload(weight);
          uint16_t* d_bias = Upload(bias);
          int32_t* d_rows = Upload(rows);
          void* d_out = nullptr;
          float* d_scales = nullptr;
          CUDA_REQUIRE(cudaMalloc(&d_out, static_cast<size_t>(R) * hidden * 2));
          CUDA_REQUIRE(cudaMalloc(&d_scales, static_cast<size_t>(R) * 4));
          RmsNormArgs a;
          a.residual = d_res;
          a.delta = with_delta ? d_delta : nullptr;
          a.delta_scale = scaled_delta ? d_ds : nullptr;
          a.delta_bias = biased ? d_bias : nullptr;
          a.weight = d_w;
          a.rows = gather ? d_rows : nullptr;
          a.num_rows = R;
          a.hidden = hidden;
          a.eps = 1e-5f;
          if (fp8) {
            a.out_fp8 = {d_out, d_scales};
          } else {
            a.out = d_out;
          }
          LaunchAddRmsNorm(a, nullptr);
          CUDA_REQUIRE(cudaDeviceSynchronize());
          // Host: the residual gains the delta on the processed rows; each output row is normed.
          std::vector<float> want_res = res, want_out(static_cast<size_t>(R) * hidden);
          for (int r = 0; r < R; ++r) {
            const int t = gather ? rows[r] : r;
            double ss = 0;
            for (int i = 0; i < hidden; ++i) {
              float& x = want_res[static_cast<size_t>(t) * hidden + i];
              if (with_delta) {
                const float d = Bf16ToF32(delta[static_cast<size_t>(t) * hidden + i]);
                const float b = biased ? Bf16ToF32(bias[i]) : 0.f;
                x += (scaled_delta ? d * delta_scale[t] : d) + b;
              }
              ss += static_cast<double>(x) * x;
            }
            const float inv = 1.f / std::sqrt(static_cast<float>(ss / hidden) + 1e-5f);
            for (int i = 0; i < hidden; ++i) {
              want_out[static_cast<size_t>(r) * hidden + i] =
                  want_res[static_cast<size_t>(t) * hidden + i] * inv * Bf16ToF32(weight[i]);
            }
          }
          const auto got_res = Download(d_res, res.size());
          if (!scaled_delta) {
            CHECK(got_res == want_res);  // fp32 adds (d + b, then x): exact
          } else {                       // the device may fuse delta * scale + x into one rounding
            int bad = 0;
            for (size_t i = 0; i < got_res.size(); ++i) {
              bad += std::fabs(got_res[i] - want_res[i]) > 1e-6f * (1.f + std::fabs(want_res[i]));
            }
            CHECK(bad == 0);
          }
          if (fp8) {
            CheckFp8Rows(Download(static_cast<uint8_t*>(d_out), want_out.size()),
                         Download(d_scales, R), want_out, hidden);
          } else {
            CheckBf16Close(Download(static_cast<uint16_t*>(d_out), want_out.size()), want_out);
          }
          for (void* p :
               {static_cast<void*>(d_res), static_cast<void*>(d_delta), static_cast<void*>(d_ds),
                static_cast<void*>(d_w), static_cast<void*>(d_bias), static_cast<void*>(d_rows),
                d_out, static_cast<void*>(d_scales)}) {
            cudaFree(p);
          }
        }
      }
    }
  }
  // 1001: the scalar kernels; 40000: fp8 rows too wide to stay in registers.
  for (int inter : {512, 14336, 1001, 40000}) {
    for (int T : {1, 5, 64}) {
      for (bool fp8 : {false, true}) {
        INFO("inter " << inter << " T " << T << " fp8 " << fp8);
        const auto gu = RandomBf16(static_cast<size_t>(T) * 2 * inter, rng);
        const auto gu_scale = RandomRowScales(T, rng);
        uint16_t* d_gu = Upload(gu);
        float* d_gs = Upload(gu_scale);
        void* d_act = nullptr;
        float* d_scales = nullptr;
        CUDA_REQUIRE(cudaMalloc(&d_act, static_cast<size_t>(T) * inter * 2));
        CUDA_REQUIRE(cudaMalloc(&d_scales, static_cast<size_t>(T) * 4));
        // fp8 cases also take row-scaled input (an fp8 gate_up projection's raw output).
        SiluMulArgs a;
        a.gate_up = d_gu;
        a.gate_up_scale = fp8 ? d_gs : nullptr;
        a.num_tokens = T;
        a.inter = inter;
        if (fp8) {
          a.act_fp8 = {d_act, d_scales};
        } else {
          a.act = d_act;
        }
        LaunchSiluMul(a, nullptr);
        CUDA_REQUIRE(cudaDeviceSynchronize());
        std::vector<float> want(static_cast<size_t>(T) * inter);
        for (int t = 0; t < T; ++t) {
          const float gs = fp8 ? gu_scale[t] : 1.f;
          for (int i = 0; i < inter; ++i) {
            const float x = Bf16ToF32(gu[static_cast<size_t>(t) * 2 * inter + i]) * gs;
            const float up = Bf16ToF32(gu[static_cast<size_t>(t) * 2 * inter + inter + i]) * gs;
            want[static_cast<size_t>(t) * inter + i] = x / (1.f + std::exp(-x)) * up;
          }
        }
        if (fp8) {
          CheckFp8Rows(Download(static_cast<uint8_t*>(d_act), want.size()), Download(d_scales, T),
                       want, inter);
        } else {
          CheckBf16Close(Download(static_cast<uint16_t*>(d_act), want.size()), want);
        }
        for (void* p : {static_cast<void*>(d_gu), static_cast<void*>(d_gs), d_act,
                        static_cast<void*>(d_scales)}) {
          cudaFree(p);
        }
      }
    }
  }
}

// Rotary embedding over the fused q/k/v projection: the vectorized kernel (8-byte aligned rows)
// and the per-head fallback (rows offset by one element) against the host definition, with and
// without the bias, at head dims 64 and 128, GQA 32/8 and 4/1.
TEST_CASE("Llama ops: bias + rotary split q/k/v as the host definition", "[gpu][ops]") {
  std::mt19937 rng(11);
  for (int D : {64, 128}) {
    for (int hq : {32, 4}) {
      for (int variant = 0; variant < 3; ++variant) {
        const int hkv = hq == 32 ? 8 : 1, T = 7, heads = hq + 2 * hkv, width = heads * D;
        // Row-scaled input (an fp8 projection's raw output) in the aligned and misaligned cases.
        const bool with_bias = variant != 1, misaligned = variant == 2, scaled = variant != 1;
        INFO("D " << D << " hq " << hq << " bias " << with_bias << " misaligned " << misaligned
                  << " scaled " << scaled);
        const auto qkv = RandomBf16(static_cast<size_t>(T) * width + 1, rng);
        const auto bias = RandomBf16(static_cast<size_t>(width) + 1, rng);
        const auto row_scale = RandomRowScales(T, rng);
        float* d_rs = Upload(row_scale);
        std::vector<int32_t> pos(T);
        for (int t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(rng() % 9000);
        std::vector<float> inv_freq(D / 2);
        for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(500000.f, -2.f * i / D);
        uint16_t* d_qkv = Upload(qkv);
        uint16_t* d_bias = Upload(bias);
        int32_t* d_pos = Upload(pos);
        float* d_freq = Upload(inv_freq);
        uint16_t *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;
        const size_t nq = static_cast<size_t>(T) * hq * D, nkv = static_cast<size_t>(T) * hkv * D;
        CUDA_REQUIRE(cudaMalloc(&d_q, (nq + 1) * 2));
        CUDA_REQUIRE(cudaMalloc(&d_k, (nkv + 1) * 2));
        CUDA_REQUIRE(cudaMalloc(&d_v, (nkv + 1) * 2));
        const int off = misaligned ? 1 : 0;  // one bf16 in: 2-byte aligned rows
        RopeArgs a;
        a.qkv = d_qkv + off;
        a.bias = with_bias ? d_bias + off : nullptr;
        a.qkv_scale = scaled ? d_rs : nullptr;
        a.positions = d_pos;
        a.inv_freq = d_freq;
        a.q = d_q + off;
        a.k = d_k + off;
        a.v = d_v + off;
        a.num_tokens = T;
        a.num_q_heads = hq;
        a.num_kv_heads = hkv;
        a.head_dim = D;
        LaunchBiasRope(a, nullptr);
        CUDA_REQUIRE(cudaDeviceSynchronize());
        std::vector<float> want_q(nq), want_k(nkv), want_v(nkv);
        for (int t = 0; t < T; ++t) {
          for (int h = 0; h < heads; ++h) {
            for (int i = 0; i < D / 2; ++i) {
              const size_t c1 = static_cast<size_t>(h) * D + i, c2 = c1 + D / 2;
              const float rs = scaled ? row_scale[t] : 1.f;
              float x1 = Bf16ToF32(qkv[off + static_cast<size_t>(t) * width + c1]) * rs;
              float x2 = Bf16ToF32(qkv[off + static_cast<size_t>(t) * width + c2]) * rs;
              if (with_bias) {
                x1 += Bf16ToF32(bias[off + c1]);
                x2 += Bf16ToF32(bias[off + c2]);
              }
              const float ang = static_cast<float>(pos[t]) * inv_freq[i];
              const float c = std::cos(ang), sn = std::sin(ang);
              if (h < hq) {
                const size_t o = (static_cast<size_t>(t) * hq + h) * D + i;
                want_q[o] = x1 * c - x2 * sn;
                want_q[o + D / 2] = x2 * c + x1 * sn;
              } else if (h < hq + hkv) {
                const size_t o = (static_cast<size_t>(t) * hkv + h - hq) * D + i;
                want_k[o] = x1 * c - x2 * sn;
                want_k[o + D / 2] = x2 * c + x1 * sn;
              } else {
                const size_t o = (static_cast<size_t>(t) * hkv + h - hq - hkv) * D + i;
                want_v[o] = x1;
                want_v[o + D / 2] = x2;
              }
            }
          }
        }
        auto got = [&](const uint16_t* d, size_t n) {
          auto v = Download(d, n + 1);
          return std::vector<uint16_t>(v.begin() + off, v.begin() + off + n);
        };
        CheckBf16Close(got(d_q, nq), want_q);
        CheckBf16Close(got(d_k, nkv), want_k);
        CheckBf16Close(got(d_v, nkv), want_v);
        for (void* p :
             {static_cast<void*>(d_qkv), static_cast<void*>(d_bias), static_cast<void*>(d_pos),
              static_cast<void*>(d_freq), static_cast<void*>(d_q), static_cast<void*>(d_k),
              static_cast<void*>(d_v), static_cast<void*>(d_rs)}) {
          cudaFree(p);
        }
      }
    }
  }
}

}  // namespace
}  // namespace llm::cuda
