// GPU_CHECK for CUDA runtime calls, and the one place CUDA-vs-HIP naming differences live.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "base/status.h"

#define GPU_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                            \
    cudaError_t _e = (expr);                                                      \
    if (_e != cudaSuccess) {                                                      \
      return ::llm::Internal(std::string(#expr) + ": " + cudaGetErrorString(_e)); \
    }                                                                             \
  } while (0)

#define GPU_CHECK(expr)                                                      \
  do {                                                                       \
    cudaError_t _e = (expr);                                                 \
    LLM_CHECK(_e == cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)

namespace llm::cuda {

// cudaMalloc that leaves no pending error behind when it fails: a failed allocation also sets the
// thread's last error, which the next launch check (cudaGetLastError) would report as its own,
// failing steps that have nothing to do with the allocation.
inline Status DeviceMalloc(void** ptr, size_t bytes) {
  const cudaError_t e = cudaMalloc(ptr, bytes);
  if (e == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  *ptr = nullptr;
  const std::string what =
      "cudaMalloc of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(e);
  return e == cudaErrorMemoryAllocation ? ResourceExhausted(what) : Internal(what);
}

// Grows a device (or pinned host) buffer to at least `bytes`, doubling to amortize; contents are
// not kept. The plan uploads of the CUDA attention backends reuse their buffers across steps.
inline Status GrowDeviceBuffer(void** ptr, size_t* cap, size_t bytes) {
  if (bytes <= *cap) return Status::Ok();
  const size_t n = std::max(bytes, 2 * *cap);
  if (*ptr) GPU_RETURN_IF_ERROR(cudaFree(*ptr));
  *ptr = nullptr;
  *cap = 0;
  LLM_RETURN_IF_ERROR(DeviceMalloc(ptr, n));
  *cap = n;
  return Status::Ok();
}
inline Status GrowPinnedBuffer(void** ptr, size_t* cap, size_t bytes) {
  if (bytes <= *cap) return Status::Ok();
  const size_t n = std::max(bytes, 2 * *cap);
  if (*ptr) GPU_RETURN_IF_ERROR(cudaFreeHost(*ptr));
  *ptr = nullptr;
  *cap = 0;
  GPU_RETURN_IF_ERROR(cudaMallocHost(ptr, n));
  *cap = n;
  return Status::Ok();
}

}  // namespace llm::cuda
