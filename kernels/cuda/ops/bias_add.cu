// kernels/cuda/ops/bias_ops.h: one thread per element.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/ops/bias_ops.h"

namespace llm::cuda {
namespace {

__global__ void AddBiasRowsKernel(__nv_bfloat16* x, const __nv_bfloat16* bias, int rows, int cols) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long n = static_cast<long long>(rows) * cols;
  if (i >= n) return;
  x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(bias[i % cols]));
}

}  // namespace

void LaunchAddBiasRows(void* x, const void* bias, int rows, int cols, void* stream) {
  const long long n = static_cast<long long>(rows) * cols;
  if (n == 0) return;
  const int threads = 256;
  AddBiasRowsKernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0,
                      static_cast<cudaStream_t>(stream)>>>(
      static_cast<__nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(bias), rows, cols);
}

}  // namespace llm::cuda
