#include "kernels/cuda/fp8_quant.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/block_abs_max.cuh"

namespace llm::cuda {
namespace {

// engine/base/quant.h DynamicScale(amax, 448).
__device__ __forceinline__ float Fp8Scale(float amax) {
  const float s = amax / 448.0f;
  return (s > 0.0f && isfinite(s)) ? s : 1.0f;
}

// Both kernels move 8 elements per 16-byte access where x is 16-byte aligned (always, for the
// model's buffers), with a scalar loop for the rest.
constexpr int kVec = 8;

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__global__ void AbsMaxKernel(const __nv_bfloat16* x, int64_t n, float* amax) {
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nv = Aligned16(x) ? n / kVec : 0;
  for (int64_t i = tid; i < nv; i += stride) {
    const uint4 w = reinterpret_cast<const uint4*>(x)[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
    for (int k = 0; k < kVec / 2; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  for (int64_t i = nv * kVec + tid; i < n; i += stride) m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  detail::BlockFoldAbsMax(m, amax);
}

__device__ __forceinline__ __nv_fp8_storage_t ToFp8(float v, float s) {
  return __nv_cvt_float_to_fp8(v / s, __NV_SATFINITE, __NV_E4M3);
}

__global__ void QuantizeKernel(const __nv_bfloat16* x, int64_t n, const float* amax, float* scale,
                               __nv_fp8_storage_t* out) {
  const float s = Fp8Scale(*amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nv = Aligned16(x) && (reinterpret_cast<uintptr_t>(out) & 7u) == 0 ? n / kVec : 0;
  for (int64_t i = tid; i < nv; i += stride) {
    const uint4 w = reinterpret_cast<const uint4*>(x)[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
    uint32_t q[2] = {0u, 0u};
#pragma unroll
    for (int k = 0; k < kVec / 2; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      const uint32_t pair =
          static_cast<uint32_t>(ToFp8(f.x, s)) | (static_cast<uint32_t>(ToFp8(f.y, s)) << 8);
      q[k / 2] |= pair << (16 * (k % 2));
    }
    reinterpret_cast<uint2*>(out)[i] = make_uint2(q[0], q[1]);
  }
  for (int64_t i = nv * kVec + tid; i < n; i += stride) out[i] = ToFp8(__bfloat162float(x[i]), s);
}

int Blocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n / kVec + 255) / 256, 1, 1024));
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
