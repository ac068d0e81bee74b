// Device-memory helpers shared by the CUDA model runtimes (cuda_model_runner.cc and
// the decoder definitions): an owning device buffer, bf16 weight upload
// (or deterministic random fill for dummy weights) and the row-major bf16 GEMM.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loader/safetensors.h"
#include "kernels/cuda/common/blas_check.h"
#include "kernels/cuda/common/cuda_check.h"

namespace llm {

// A device allocation that frees itself.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  Status Alloc(size_t n) {
    if (n <= bytes) return Status::Ok();
    if (ptr) GPU_RETURN_IF_ERROR(cudaFree(ptr));
    ptr = nullptr;
    LLM_RETURN_IF_ERROR(cuda::DeviceMalloc(&ptr, n));
    bytes = n;
    return Status::Ok();
  }
  void Reset() {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// Uploads checkpoint tensors as bf16, or (weights == null) fills them on the device with
// deterministic random values mean + std * U(-sqrt3, sqrt3), one seed per tensor.
class Bf16WeightLoader {
 public:
  Bf16WeightLoader(const WeightStore* weights, cudaStream_t stream)
      : weights_(weights), stream_(stream) {}
  bool dummy() const { return weights_ == nullptr; }
  // Several sources are stacked in order into one buffer.
  Status Load(const std::vector<std::string>& names,
              const std::vector<std::vector<int64_t>>& shapes, float mean, float std,
              DeviceBuffer* out);

 private:
  const WeightStore* weights_;
  cudaStream_t stream_;
  uint64_t seed_ = 1;
};

// Row-major y[m, n] = x[m, k] @ w[n, k]^T with bf16 x and w, out_type y, fp32 accumulation;
// beta = 1 accumulates into y.
Status GemmBf16(cublasHandle_t blas, const void* x, const void* w, int m, int n, int k, void* y,
                cudaDataType out_type, float beta = 0.0f);

}  // namespace llm
