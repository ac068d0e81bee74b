#include "engine/layers/cuda/cuda_weights.h"

#include "base/dtype.h"
#include "kernels/cuda/ops/elementwise_ops.h"

namespace llm {

Status Bf16WeightLoader::Load(const std::vector<std::string>& names,
                              const std::vector<std::vector<int64_t>>& shapes, float mean,
                              float std, DeviceBuffer* out) {
  size_t n = 0;
  for (const auto& s : shapes) {
    size_t e = 1;
    for (int64_t d : s) e *= static_cast<size_t>(d);
    n += e;
  }
  LLM_RETURN_IF_ERROR(out->Alloc(n * 2));
  if (dummy()) {
    cuda::LaunchFillRandomBf16(out->ptr, static_cast<int64_t>(n), mean, std, seed_++, stream_);
    GPU_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }
  std::vector<uint16_t> host;
  host.reserve(n);
  std::vector<float> f;
  for (size_t i = 0; i < names.size(); ++i) {
    LLM_RETURN_IF_ERROR(weights_->ReadF32(names[i], shapes[i], &f));
    for (float x : f) host.push_back(F32ToBf16(x));
  }
  GPU_RETURN_IF_ERROR(cudaMemcpy(out->ptr, host.data(), n * 2, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status GemmBf16(cublasHandle_t blas, const void* x, const void* w, int m, int n, int k, void* y,
                cudaDataType out_type, float beta) {
  // Row-major y[m,n] = x[m,k] w[n,k]^T is column-major y^T[n,m] = w^T . x^T.
  const float alpha = 1.0f;
  BLAS_RETURN_IF_ERROR(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF,
                                    k, x, CUDA_R_16BF, k, &beta, y, out_type, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

}  // namespace llm
