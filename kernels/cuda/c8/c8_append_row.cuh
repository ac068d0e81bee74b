// Storing one token's K or V head row into a C8 cache (internal): the quantization that
// base/quant.h defines, shared by the append kernel (c8_append.cu) and the decode tiles
// that append their sequence's new token themselves (c8_tile_kernel.cuh), so both store the same
// bytes and dynamic scales.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/common/ptx_ops.cuh"

namespace llm::cuda::detail {

// Quantization exactly as base/quant.h defines it.
__device__ __forceinline__ int8_t QuantInt8(float x, float scale) {
  float q = rintf(x / scale);
  if (q != q) q = 0.f;
  q = fminf(fmaxf(q, -127.f), 127.f);
  return static_cast<int8_t>(q);
}
__device__ __forceinline__ uint8_t QuantFp8(float x, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3));
}

// Stores four consecutive elements d..d+3 of one cache row (bf16-rounded values; the scale as
// the mode defines it).
__device__ __forceinline__ void StoreFour(const float (&y)[4], int cache_type, int scale_mode,
                                          const float* scale, int d, float s_row, void* cache,
                                          size_t row) {
  if (cache_type == static_cast<int>(CacheType::kBf16)) {
    ptx::StoreBf16x4(static_cast<__nv_bfloat16*>(cache) + row + d, y);
    return;
  }
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float s = scale_mode == static_cast<int>(ScaleMode::kPerChannel) ? scale[d + j] : s_row;
    // int8 is stored excess-128 (C8Shape): the tile kernel's dequantization then needs no fix-up.
    const uint32_t b = cache_type == static_cast<int>(CacheType::kInt8)
                           ? static_cast<uint8_t>(QuantInt8(y[j], s)) ^ 0x80u
                           : QuantFp8(y[j], s);
    packed |= b << (8 * j);
  }
  *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(cache) + row + d) = packed;
}

// Where one head row of a token goes: `scale` is the K or V scale array of the mode, kv_head the
// row's KV head, cache_row its row index in the cache ([blocks, kv_heads, block_size]).
struct AppendRowDst {
  void* cache;
  float* scale;
  int kv_head;
  size_t cache_row;
};

// Pairs i..i+3 and i+half..i+half+3 (x1, x2: final fp32 values, rotated where they should be) of
// a K or V head row: rounded to bf16, quantized and stored when `store`. The row's kLanes threads
// are consecutive lanes; with per-token scales they reduce the row's max together, so every lane
// of the warp must call this (with store false where it has no row).
template <int kLanes>
__device__ __forceinline__ void AppendRowPart(float (&x1)[4], float (&x2)[4], bool store,
                                              int cache_type, int scale_mode, int i, int half,
                                              const AppendRowDst& dst) {
  const float qmax = cache_type == static_cast<int>(CacheType::kInt8) ? 127.f : 448.f;
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x1[j] = __bfloat162float(__float2bfloat16_rn(x1[j]));
    x2[j] = __bfloat162float(__float2bfloat16_rn(x2[j]));
    amax = fmaxf(amax, fmaxf(fabsf(x1[j]), fabsf(x2[j])));
  }
  if (scale_mode == static_cast<int>(ScaleMode::kPerToken)) {
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
    }
  }
  if (!store) return;
  const float* scale = dst.scale;
  float s_row = 1.f;
  if (scale_mode == static_cast<int>(ScaleMode::kPerToken)) {
    s_row = amax / qmax;  // base/quant.h DynamicScale
    if (!(s_row > 0.f && isfinite(s_row))) s_row = 1.f;
    if (i == 0 && cache_type != static_cast<int>(CacheType::kBf16))
      dst.scale[dst.cache_row] = s_row;
  } else if (scale_mode == static_cast<int>(ScaleMode::kPerHead)) {
    s_row = scale[dst.kv_head];
  } else if (scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
    scale += static_cast<size_t>(dst.kv_head) * (2 * half);
  }
  const size_t row = dst.cache_row * (2 * half);
  StoreFour(x1, cache_type, scale_mode, scale, i, s_row, dst.cache, row);
  StoreFour(x2, cache_type, scale_mode, scale, i + half, s_row, dst.cache, row);
}

}  // namespace llm::cuda::detail
