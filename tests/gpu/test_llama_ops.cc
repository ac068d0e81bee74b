// The Llama element-wise kernels (kernels/cuda/llama_ops.h) against a host computation of the same
// definition, on shapes that take the vectorized paths (multiples of 8) and the scalar fallbacks
// (odd widths), with and without the residual delta and the row gather, and with and without the
// fp8 activation absmax they can produce.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/base/dtype.h"
#include "kernels/cuda/llama_ops.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

template <typename T>
T* Upload(const std::vector<T>& h) {
  T* d = nullptr;
  REQUIRE(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return d;
}
template <typename T>
std::vector<T> Download(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

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

// What LaunchAbsMaxBf16 defines: max |x| over the bf16 values, in fp32.
float MaxAbsBf16(const std::vector<uint16_t>& v) {
  float m = 0.f;
  for (uint16_t x : v) m = std::max(m, std::fabs(Bf16ToF32(x)));
  return m;
}

TEST_CASE("Llama ops: add + RMSNorm and SiluMul match the host definition", "[gpu][ops]") {
  std::mt19937 rng(std::random_device{}());
  for (int hidden : {256, 4096, 4100, 8192, 8200}) {
    for (int T : {1, 3, 17}) {
      for (bool with_delta : {false, true}) {
        for (bool gather : {false, true}) {
          INFO("hidden " << hidden << " T " << T << " delta " << with_delta << " gather "
                         << gather);
          std::normal_distribution<float> nd(0.f, 2.f);
          std::vector<float> res(static_cast<size_t>(T) * hidden);
          for (auto& x : res) x = nd(rng);
          const auto delta = RandomBf16(res.size(), rng);
          const auto weight = RandomBf16(hidden, rng, 1.f);
          std::vector<int32_t> rows;
          for (int t = T - 1; t >= 0; t -= 2) rows.push_back(t);  // reversed, every other row
          const int R = gather ? static_cast<int>(rows.size()) : T;
          float* d_res = Upload(res);
          uint16_t* d_delta = Upload(delta);
          uint16_t* d_w = Upload(weight);
          int32_t* d_rows = Upload(rows);
          uint16_t* d_out = nullptr;
          CUDA_REQUIRE(cudaMalloc(&d_out, static_cast<size_t>(R) * hidden * 2));
          // The fp8 absmax output (half the cases; the other half take the kernels without it).
          float* d_amax = Upload(std::vector<float>{0.f});
          LaunchAddRmsNorm(d_res, with_delta ? d_delta : nullptr, d_w, gather ? d_rows : nullptr, R,
                           hidden, 1e-5f, d_out, nullptr, with_delta ? d_amax : nullptr);
          CUDA_REQUIRE(cudaDeviceSynchronize());
          // Host: the residual gains the delta on the processed rows; each output row is normed.
          std::vector<float> want_res = res, want_out(static_cast<size_t>(R) * hidden);
          for (int r = 0; r < R; ++r) {
            const int t = gather ? rows[r] : r;
            double ss = 0;
            for (int i = 0; i < hidden; ++i) {
              float& x = want_res[static_cast<size_t>(t) * hidden + i];
              if (with_delta) x += Bf16ToF32(delta[static_cast<size_t>(t) * hidden + i]);
              ss += static_cast<double>(x) * x;
            }
            const float inv = 1.f / std::sqrt(static_cast<float>(ss / hidden) + 1e-5f);
            for (int i = 0; i < hidden; ++i) {
              want_out[static_cast<size_t>(r) * hidden + i] =
                  want_res[static_cast<size_t>(t) * hidden + i] * inv * Bf16ToF32(weight[i]);
            }
          }
          CHECK(Download(d_res, res.size()) == want_res);  // fp32 adds: exact
          const auto got_out = Download(d_out, want_out.size());
          CheckBf16Close(got_out, want_out);
          CHECK(Download(d_amax, 1)[0] == (with_delta ? MaxAbsBf16(got_out) : 0.f));
          for (void* p : {static_cast<void*>(d_res), static_cast<void*>(d_delta),
                          static_cast<void*>(d_w), static_cast<void*>(d_rows),
                          static_cast<void*>(d_out), static_cast<void*>(d_amax)}) {
            cudaFree(p);
          }
        }
      }
    }
  }
  for (int inter : {512, 14336, 1001}) {
    for (int T : {1, 5, 64}) {
      INFO("inter " << inter << " T " << T);
      const auto gu = RandomBf16(static_cast<size_t>(T) * 2 * inter, rng);
      uint16_t* d_gu = Upload(gu);
      uint16_t* d_act = nullptr;
      CUDA_REQUIRE(cudaMalloc(&d_act, static_cast<size_t>(T) * inter * 2));
      float* d_amax = Upload(std::vector<float>{0.f});
      const bool with_amax = T != 5;
      LaunchSiluMul(d_gu, T, inter, d_act, nullptr, with_amax ? d_amax : nullptr);
      CUDA_REQUIRE(cudaDeviceSynchronize());
      std::vector<float> want(static_cast<size_t>(T) * inter);
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < inter; ++i) {
          const float x = Bf16ToF32(gu[static_cast<size_t>(t) * 2 * inter + i]);
          const float up = Bf16ToF32(gu[static_cast<size_t>(t) * 2 * inter + inter + i]);
          want[static_cast<size_t>(t) * inter + i] = x / (1.f + std::exp(-x)) * up;
        }
      }
      const auto got = Download(d_act, want.size());
      CheckBf16Close(got, want);
      CHECK(Download(d_amax, 1)[0] == (with_amax ? MaxAbsBf16(got) : 0.f));
      cudaFree(d_gu);
      cudaFree(d_act);
      cudaFree(d_amax);
    }
  }
}

}  // namespace
}  // namespace llm::cuda
