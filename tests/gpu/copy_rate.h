// The device-to-device copy rate the MoE benchmarks take as their floor, measured in their own
// run (tests/gpu "[.bench][moe_mxfp4]", "[.bench][moe_fp8]", "[.bench][moe_small]").
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "engine/layers/cuda/cuda_weights.h"

namespace llm::gpu_test {

// The device-to-device copy rate of this GPU now (bytes read plus bytes written per second, the
// best of five 1 GiB copies): the floor of the benchmarks that measure it in their own run.
inline double MeasureCopyRate(cudaStream_t stream) {
  const size_t bytes = 1ull << 30;
  DeviceBuffer src, dst;
  REQUIRE(src.Alloc(bytes).ok());
  REQUIRE(dst.Alloc(bytes).ok());
  REQUIRE(cudaMemsetAsync(src.ptr, 1, bytes, stream) == cudaSuccess);
  cudaEvent_t e0, e1;
  REQUIRE(cudaEventCreate(&e0) == cudaSuccess);
  REQUIRE(cudaEventCreate(&e1) == cudaSuccess);
  float best_ms = 1e30f;
  for (int i = 0; i < 7; ++i) {
    REQUIRE(cudaEventRecord(e0, stream) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, stream) ==
            cudaSuccess);
    REQUIRE(cudaEventRecord(e1, stream) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(e1) == cudaSuccess);
    float ms = 0;
    REQUIRE(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
    if (i >= 2) best_ms = std::min(best_ms, ms);  // the first two warm up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * bytes / (best_ms * 1e-3);
}

}  // namespace llm::gpu_test
