// KV append (quantizing) kernel for C8 attention. (Split-KV chunks are merged inside the tile
// kernel: c8_tile_kernel.cuh.)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/c8_kernel_args.h"
#include "kernels/cuda/pdl_launch.cuh"
#include "kernels/cuda/ptx_ops.cuh"

namespace llm::cuda::detail {
namespace {

// Quantization exactly as engine/base/quant.h defines it.
__device__ __forceinline__ int8_t QuantInt8(float x, float scale) {
  float q = rintf(x / scale);
  if (q != q) q = 0.f;
  q = fminf(fmaxf(q, -127.f), 127.f);
  return static_cast<int8_t>(q);
}
__device__ __forceinline__ uint8_t QuantFp8(float x, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3));
}

// One warp per (token, kv head): writes K and V rows into their cache slot.
template <int D>
__global__ void AppendKernel(const AppendArgs a, int cache_type) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int warp_global = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp_global >= a.num_tokens * a.num_kv_heads) return;
  const int tok = warp_global / a.num_kv_heads, h = warp_global % a.num_kv_heads;
  const int slot = a.slots[tok];
  if (slot < 0) return;
  const int block = slot / a.block_size, off = slot % a.block_size;
  const size_t dst = ((static_cast<size_t>(block) * a.num_kv_heads + h) * a.block_size + off) * D;
  const size_t src = (static_cast<size_t>(tok) * a.num_kv_heads + h) * D;
  constexpr int kPer = D / 32;
#pragma unroll
  for (int kv = 0; kv < 2; ++kv) {
    const __nv_bfloat16* in = static_cast<const __nv_bfloat16*>(kv ? a.v_new : a.k_new) + src;
    void* cache = kv ? a.v_cache : a.k_cache;
    float* scale = kv ? a.v_scale : a.k_scale;
    float x[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) x[i] = __bfloat162float(in[lane * kPer + i]);
    if (cache_type == static_cast<int>(CacheType::kBf16)) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        static_cast<__nv_bfloat16*>(cache)[dst + lane * kPer + i] = in[lane * kPer + i];
      }
      continue;
    }
    float s_head = 1.f;
    if (a.scale_mode == static_cast<int>(ScaleMode::kPerToken)) {
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
      const float qmax = cache_type == static_cast<int>(CacheType::kInt8) ? 127.f : 448.f;
      s_head = amax / qmax;  // engine/base/quant.h DynamicScale
      if (!(s_head > 0.f && isfinite(s_head))) s_head = 1.f;
      if (lane == 0) {
        scale[(static_cast<size_t>(block) * a.num_kv_heads + h) * a.block_size + off] = s_head;
      }
    } else if (a.scale_mode == static_cast<int>(ScaleMode::kPerHead)) {
      s_head = scale[h];
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = lane * kPer + i;
      const float s =
          a.scale_mode == static_cast<int>(ScaleMode::kPerChannel) ? scale[h * D + d] : s_head;
      if (cache_type == static_cast<int>(CacheType::kInt8)) {
        // Stored excess-128 (C8Shape): the tile kernel's dequantization then needs no fix-up.
        static_cast<uint8_t*>(cache)[dst + d] = static_cast<uint8_t>(QuantInt8(x[i], s)) ^ 0x80u;
      } else {
        static_cast<uint8_t*>(cache)[dst + d] = QuantFp8(x[i], s);
      }
    }
  }
}

}  // namespace

void LaunchAppend(const AppendArgs& a, CacheType cache, int head_dim, void* stream) {
  if (a.num_tokens == 0) return;
  const int warps = a.num_tokens * a.num_kv_heads;
  const int threads = 256;
  const int blocks = (warps * 32 + threads - 1) / threads;
  auto s = static_cast<cudaStream_t>(stream);
  if (head_dim == 64) {
    (void)LaunchPdl(AppendKernel<64>, dim3(blocks), dim3(threads), 0, s, a,
                    static_cast<int>(cache));
  } else {
    (void)LaunchPdl(AppendKernel<128>, dim3(blocks), dim3(threads), 0, s, a,
                    static_cast<int>(cache));
  }
}

}  // namespace llm::cuda::detail
