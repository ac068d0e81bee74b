// The small-batch GEMVs of bf16 projections (kernels/cuda/ops/dense_gemv.h) against an fp64
// reference, and their benchmark against cuBLAS (GemmBf16, what CudaLinear::RunBf16 ran before)
// at the projections of the models whose batch-1 steps issue 51 times.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "engine/layers/cuda/cuda_weights.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/ops/dense_gemv.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_bench_util.h"

namespace llm {
namespace {

using cuda::Download;
using cuda::Upload;

// Every output of rows x W^T within fp32 summation error of the fp64 sum (a bound on the sum of
// |terms|) plus the bf16 rounding of the store.
void Check(int rows, int n, int k, int split, bool out_fp32, std::mt19937& rng) {
  INFO("rows " << rows << " n " << n << " k " << k << " split " << split << " fp32 out "
               << out_fp32);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(static_cast<size_t>(rows) * k), w(static_cast<size_t>(n) * k);
  for (auto& v : x) v = F32ToBf16(nd(rng));
  for (auto& v : w) v = F32ToBf16(nd(rng));
  cuda::DeviceAllocs d;
  const uint16_t* dx = d.Up(x);
  const uint16_t* dw = d.Up(w);
  const size_t out_bytes = static_cast<size_t>(rows) * n * (out_fp32 ? 4 : 2);
  // NaN-filled: an output the kernel skips fails the check.
  std::vector<uint8_t> fill(out_bytes + 64, 0xFF);
  uint8_t* dy = d.Up(fill);
  REQUIRE(cuda::LaunchDenseGemvBf16(dx, dw, rows, n, k, dy, out_fp32, nullptr, split));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> got(static_cast<size_t>(rows) * n);
  if (out_fp32) {
    got = Download(reinterpret_cast<const float*>(dy), got.size());
  } else {
    const std::vector<uint16_t> h = Download(reinterpret_cast<const uint16_t*>(dy), got.size());
    for (size_t i = 0; i < h.size(); ++i) got[i] = Bf16ToF32(h[i]);
  }
  // Past the outputs: untouched.
  const std::vector<uint8_t> tail = Download(dy + out_bytes, 64);
  CHECK(tail == std::vector<uint8_t>(64, 0xFF));
  double worst = 0;
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int c = 0; c < k; ++c) {
        const double t = static_cast<double>(Bf16ToF32(x[static_cast<size_t>(r) * k + c])) *
                         Bf16ToF32(w[static_cast<size_t>(j) * k + c]);
        s += t;
        mag += std::fabs(t);
      }
      const double g = got[static_cast<size_t>(r) * n + j];
      const double bound = 1e-5 * mag + (out_fp32 ? 0.0 : std::fabs(s) * (1.0 / 256));
      worst = std::max(worst, std::fabs(g - s) / (bound + 1e-30));
      if (!(std::fabs(g - s) <= bound)) {
        INFO("row " << r << " column " << j << ": " << g << " against " << s << ", bound "
                    << bound);
        REQUIRE(std::fabs(g - s) <= bound);
      }
    }
  }
  WARN("worst error " << worst << " of its bound");
}

TEST_CASE("Dense GEMV matches the fp64 reference (rows 1-4, k split over 1-8 warps)",
          "[gpu][dense_gemv]") {
  GPU_TEST_RNG(rng);
  // n not a multiple of a CTA's columns; k of one chunk, of less than a lane round, of several
  // rounds with a ragged last one; every split, the default's choice included.
  for (const int rows : {1, 2, 3, 4}) {
    for (const auto& [n, k] : {std::pair{1, 8}, {37, 64}, {130, 1032}, {576, 2048}, {67, 4104}}) {
      for (const int split : {0, 1, 2, 4, 8}) {
        Check(rows, n, k, split, /*out_fp32=*/rows % 2 == 0, rng);
      }
    }
  }
  Check(1, 2880, 4096, 0, false, rng);  // gpt-oss's o_proj shape
  CHECK_FALSE(cuda::LaunchDenseGemvBf16(nullptr, nullptr, 5, 64, 64, nullptr, false, nullptr));
  CHECK_FALSE(cuda::LaunchDenseGemvBf16(nullptr, nullptr, 1, 64, 60, nullptr, false, nullptr));
  CHECK_FALSE(cuda::LaunchDenseGemvBf16(nullptr, nullptr, 0, 64, 64, nullptr, false, nullptr));
}

// GEMV (the default split, and 1) against cuBLAS at the projections of Llama-3-8B, Qwen3-30B-A3B,
// DeepSeek-V2-Lite and gpt-oss-20b, rows 1 / 2 / 4: each replayed from a graph over enough copies
// of the weight that the L2 holds none of the next (as a model step reads them), its weight bytes
// over the time, and that against the copy rate of the same run.
//
//   build/cuda/tests/gpu_tests "[.bench][dense_gemv]"
TEST_CASE("Dense GEMV benchmark against cuBLAS", "[.bench][dense_gemv]") {
  gpu_test::BenchOps o;
  const double copy_rate = gpu_test::MeasureCopyRate(o.stream);
  std::printf("copy rate %.2f TB/s (read + write); %d SMs\n", copy_rate / 1e12, cuda::CudaNumSms());
  std::printf("%-24s %6s %6s %4s %-8s %9s %7s %8s\n", "projection", "n", "k", "rows", "path", "us",
              "TB/s", "x floor");
  struct Shape {
    const char* name;
    int n, k;
  };
  for (const Shape sh : {Shape{"llama3-8b qkv", 6144, 4096},
                         {"llama3-8b o_proj", 4096, 4096},
                         {"llama3-8b gate_up", 28672, 4096},
                         {"llama3-8b down", 4096, 14336},
                         {"qwen3-30b qkv", 5120, 2048},
                         {"qwen3-30b o_proj", 2048, 4096},
                         {"v2-lite q_proj", 3072, 2048},
                         {"v2-lite kv_a", 576, 2048},
                         {"v2-lite o_proj", 2048, 2048},
                         {"gpt-oss qkv", 5120, 2880},
                         {"gpt-oss o_proj", 2880, 4096}}) {
    const size_t wbytes = static_cast<size_t>(sh.n) * sh.k * 2;
    const int copies = static_cast<int>(std::min<size_t>(16, (256ull << 20) / wbytes + 1));
    std::vector<DeviceBuffer> w(copies);
    for (auto& b : w) {
      REQUIRE(b.Alloc(wbytes).ok());
      REQUIRE(cudaMemset(b.ptr, 0, wbytes) == cudaSuccess);
    }
    DeviceBuffer x, y;
    REQUIRE(x.Alloc(static_cast<size_t>(4) * sh.k * 2).ok());
    REQUIRE(y.Alloc(static_cast<size_t>(4) * sh.n * 4).ok());
    REQUIRE(cudaMemset(x.ptr, 0, x.bytes) == cudaSuccess);
    const double floor_us = wbytes / copy_rate * 1e6;
    for (const int rows : {1, 2, 4}) {
      for (const int path : {0, 1, 2}) {  // cuBLAS, GEMV (default split), GEMV split 1
        const double us =
            gpu_test::MedianCapturedUs(
                o.stream,
                [&] {
                  for (int c = 0; c < copies; ++c) {
                    if (path == 0) {
                      REQUIRE(
                          GemmBf16(o.blas, x.ptr, w[c].ptr, rows, sh.n, sh.k, y.ptr, CUDA_R_16BF)
                              .ok());
                    } else {
                      REQUIRE(cuda::LaunchDenseGemvBf16(x.ptr, w[c].ptr, rows, sh.n, sh.k, y.ptr,
                                                        false, o.stream, path == 2 ? 1 : 0));
                    }
                  }
                }) /
            copies;
        const char* names[] = {"cublas", "gemv", "gemv/1"};
        std::printf("%-24s %6d %6d %4d %-8s %9.2f %7.2f %8.2f\n", sh.name, sh.n, sh.k, rows,
                    names[path], us, wbytes / us / 1e6, us / floor_us);
      }
    }
  }
}

}  // namespace
}  // namespace llm
