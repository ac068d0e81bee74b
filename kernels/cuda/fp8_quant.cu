#include "kernels/cuda/fp8_quant.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace llm::cuda {
namespace {

// Non-negative floats order like their bit patterns, so an integer atomic max is a float max.
__device__ __forceinline__ void AtomicMaxNonNegative(float* addr, float v) {
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}

// engine/base/quant.h DynamicScale(amax, 448).
__device__ __forceinline__ float Fp8Scale(float amax) {
  const float s = amax / 448.0f;
  return (s > 0.0f && isfinite(s)) ? s : 1.0f;
}

__global__ void AbsMaxKernel(const __nv_bfloat16* x, int64_t n, float* amax) {
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  __shared__ float warp_max[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>(blockDim.x / 32) ? warp_max[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if (lane == 0) AtomicMaxNonNegative(amax, m);
  }
}

__global__ void QuantizeKernel(const __nv_bfloat16* x, int64_t n, const float* amax, float* scale,
                               __nv_fp8_storage_t* out) {
  const float s = Fp8Scale(*amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = __nv_cvt_float_to_fp8(__bfloat162float(x[i]) / s, __NV_SATFINITE, __NV_E4M3);
  }
}

int Blocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + 255) / 256, 1, 1024));
}

}  // namespace

void LaunchAbsMaxBf16(const void* x, int64_t n, float* amax, void* stream) {
  if (n == 0) return;
  AbsMaxKernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), n, amax);
}

void LaunchQuantizeFp8(const void* x, int64_t n, const float* amax, float* scale, void* out,
                       void* stream) {
  QuantizeKernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), n, amax, scale, static_cast<__nv_fp8_storage_t*>(out));
}

}  // namespace llm::cuda
