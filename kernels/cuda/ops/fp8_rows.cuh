// Device helpers for fp8 (e4m3) activations with one dequant scale per row (fp8_quant.h's
// Fp8Rows) or per row and 128-wide block, shared by the kernels that produce an fp8 GEMM's input
// (internal to kernels/cuda).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace llm::cuda::detail {

// base/quant.h DynamicScale(amax, 448): never zero, never infinite.
__device__ __forceinline__ float Fp8Scale(float amax) {
  const float s = amax / 448.0f;
  return (s > 0.0f && isfinite(s)) ? s : 1.0f;
}

// base/quant.h QuantizeFp8(v, s): e4m3(v / s), nearest-even, saturating to +-448.
__device__ __forceinline__ uint32_t ToFp8(float v, float s) {
  return __nv_cvt_float_to_fp8(v / s, __NV_SATFINITE, __NV_E4M3);
}

// One warp quantizes block b (columns [128 b, 128 b + 128), the last one partial) of row xr into
// qr with one scale from the block's absmax, 4 columns a lane; returns the scale (every lane).
// The whole warp must call it (shuffles).
__device__ __forceinline__ float QuantizeBlock128(const __nv_bfloat16* xr, int cols, int b,
                                                  int lane, uint8_t* qr) {
  float v[4];
  float m = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = b * 128 + lane * 4 + j;
    v[j] = c < cols ? __bfloat162float(xr[c]) : 0.f;
    m = fmaxf(m, fabsf(v[j]));
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  const float s = Fp8Scale(m);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = b * 128 + lane * 4 + j;
    if (c < cols) qr[c] = static_cast<uint8_t>(ToFp8(v[j], s));
  }
  return s;
}

// 8 values -> 8 e4m3 bytes through one 8-byte store (p 8-byte aligned), exactly ToFp8(f[j], s).
__device__ __forceinline__ void StoreFp8x8(uint8_t* p, const float (&f)[8], float s) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j / 4] |= ToFp8(f[j], s) << (8 * (j % 4));
  *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
}

// The same with f[j] * inv_s (inv_s = 1 / s) and paired conversions: an IEEE division per element
// made the fused producers (norm, SiluMul) issue-bound. x * (1 / s) can differ from x / s in the
// last bit, so a value on an e4m3 rounding tie may land one step from ToFp8's.
// Four values f[j] * inv_s -> e4m3 bytes, f[0] in the lowest byte (paired conversions).
__device__ __forceinline__ uint32_t PackFp8x4Fast(const float* f, float inv_s) {
  const uint32_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(f[0] * inv_s, f[1] * inv_s), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(f[2] * inv_s, f[3] * inv_s), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

__device__ __forceinline__ void StoreFp8x8Fast(uint8_t* p, const float (&f)[8], float inv_s) {
  *reinterpret_cast<uint2*>(p) = make_uint2(PackFp8x4Fast(f, inv_s), PackFp8x4Fast(f + 4, inv_s));
}

// Max of v over the block, returned to every thread. Every thread must call it (barriers).
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x + 31) / 32 ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}

}  // namespace llm::cuda::detail
