// fp8 (e4m3) GEMMs through cuBLASLt, for fp8 linear weights with dynamic per-tensor activation
// scales: y[m, n] (bf16) = (x_scale * x[m, k]) @ (w_scale * w[n, k])^T with fp32 accumulation.
// Both scales are device pointers, so a CUDA graph replays with whatever scale the step's
// activation quantization computed. Built only with the CUDA backend.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "engine/base/status.h"

namespace llm {

class CudaFp8Gemm {
 public:
  CudaFp8Gemm() = default;
  CudaFp8Gemm(const CudaFp8Gemm&) = delete;
  CudaFp8Gemm& operator=(const CudaFp8Gemm&) = delete;
  ~CudaFp8Gemm();

  // workspace: device memory the matmuls may use (shared with other work on the same stream).
  Status Init(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  // x: e4m3 [m, k], w: e4m3 [n, k], y: bf16 [m, n]; k and n multiples of 16, m > 0. The
  // algorithm for each (m, n, k) is chosen once by cuBLASLt's heuristic and cached.
  Status Run(const void* x, const float* x_scale, const void* w, const float* w_scale, int m, int n,
             int k, void* y);

 private:
  struct Shape {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  StatusOr<Shape*> Get(int m, int n, int k, const float* x_scale, const float* w_scale);

  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int>, Shape> shapes_;
};

}  // namespace llm
