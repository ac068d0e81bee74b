// Shared by the fp8 GEMM tests (test_fp8_weights.cc, test_fp8_checkpoint.cc): the two cuBLASLt
// fp8 GEMMs every case compares, on one stream and workspace, and the check of their bf16 output
// against a double-precision host product.
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "engine/layers/cuda/cuda_fp8_gemm.h"

namespace llm::gpu_test {

// A GEMM's shape: y[m, n] = x[m, k] w[n, k]^T.
struct GemmDims {
  int m, n, k;
};

// `gemm` promotes partial sums to fp32; `fast_gemm` keeps them in the tensor cores' narrower
// accumulator (ModelLoadOptions::fp8_fast_accumulation), tuned for decode-sized m.
struct Fp8GemmPair {
  static constexpr size_t kWorkspaceBytes = 32ull << 20;

  Fp8GemmPair() {
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cudaMalloc(&workspace, kWorkspaceBytes) == cudaSuccess);
    REQUIRE(gemm.Init(stream, workspace, kWorkspaceBytes).ok());
    REQUIRE(fast_gemm
                .Init(stream, workspace, kWorkspaceBytes, /*tune_max_m=*/256,
                      /*fast_accum=*/true)
                .ok());
  }
  ~Fp8GemmPair() {
    cudaFree(workspace);
    cudaStreamDestroy(stream);
  }
  Fp8GemmPair(const Fp8GemmPair&) = delete;
  Fp8GemmPair& operator=(const Fp8GemmPair&) = delete;

  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  CudaFp8Gemm gemm, fast_gemm;
};

// The first m rows of y (bf16 on the device, [>= m, n]) against want [m, n]: relative L2 error
// below rel_bound and max error within max_bound x max |want|. A wrong scale or layout is off by
// O(1), far above either bound.
inline void CheckBf16Rows(const char* what, const void* y, const std::vector<double>& want, int m,
                          int n, double rel_bound, double max_bound) {
  std::vector<uint16_t> got(static_cast<size_t>(m) * n);
  REQUIRE(cudaMemcpy(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  double err2 = 0, ref2 = 0, ref_max = 0, err_max = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = Bf16ToF32(got[i]) - want[i];
    err2 += e * e;
    ref2 += want[i] * want[i];
    ref_max = std::max(ref_max, std::fabs(want[i]));
    err_max = std::max(err_max, std::fabs(e));
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  INFO(what << ": relative L2 error " << rel << ", max error " << err_max << " of max |y| "
            << ref_max);
  CHECK(std::isfinite(rel));
  CHECK(rel < rel_bound);
  CHECK(err_max <= max_bound * ref_max);
}

}  // namespace llm::gpu_test
