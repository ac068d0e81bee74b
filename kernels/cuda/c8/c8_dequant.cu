// Dequantizes the 8-bit paged cache of a step's prefill sequences into packed bf16 rows, which the
// sm_90a wgmma FMHA kernel then attends over (C8Attention::SetPrefillFmha).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/c8/c8_kernel_args.h"

namespace llm::cuda::detail {
namespace {

constexpr int kDequantTokens = 16;  // tokens per CTA

// Byte -> quantized value: int8 is stored excess-128 (c8_attention.h), fp8 as e4m3fn.
template <bool kFp8>
__device__ __forceinline__ float Decode8(uint32_t b) {
  if constexpr (kFp8) {
    return __half2float(
        __half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
  } else {
    return static_cast<float>(static_cast<int>(b) - 128);  // byte = q ^ 0x80
  }
}

// Grid (ceil(max_kv / kDequantTokens), sequences); each thread turns 16 bytes of one token's K or
// V head row into 16 bf16 values, x = q * scale (base/quant.h), rounded to nearest.
template <int D, bool kFp8>
__global__ void __launch_bounds__(256) DequantKvKernel(const DequantArgs a) {
  constexpr int kChunks = D / 16;
  const int s = blockIdx.y;
  const int k0 = a.seqstart_k[s], len = a.seqstart_k[s + 1] - k0;
  const int j0 = blockIdx.x * kDequantTokens;
  if (j0 >= len) return;
  const int hkv = a.num_kv_heads, bs_mask = (1 << a.log2_block_size) - 1;
  const int32_t* pages = a.pages + a.page_base[s];
  const int units = 2 * kDequantTokens * hkv * kChunks;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const int c = u % kChunks;
    const int h = (u / kChunks) % hkv;
    const int t = (u / (kChunks * hkv)) % kDequantTokens;
    const bool is_v = u >= units / 2;
    const int j = j0 + t;
    if (j >= len) continue;
    const int page = pages[j >> a.log2_block_size], off = j & bs_mask;
    auto* dst = static_cast<__nv_bfloat16*>(is_v ? a.v_out : a.k_out) +
                ((static_cast<size_t>(k0) + j) * hkv + h) * D + c * 16;
    if (page < 0) {  // freed, left of every window (the mask hides it): zeros, never NaN
      reinterpret_cast<uint4*>(dst)[0] = make_uint4(0, 0, 0, 0);
      reinterpret_cast<uint4*>(dst)[1] = make_uint4(0, 0, 0, 0);
      continue;
    }
    const size_t row = ((static_cast<size_t>(page) * hkv + h) << a.log2_block_size) + off;
    const uint8_t* cache = static_cast<const uint8_t*>(is_v ? a.v_cache : a.k_cache);
    const uint4 raw = *reinterpret_cast<const uint4*>(cache + row * D + c * 16);
    const float* scales = is_v ? a.v_scale : a.k_scale;
    float sc[16];
    if (a.scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
      const float4* p = reinterpret_cast<const float4*>(scales + h * D + c * 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 f = p[i];
        sc[4 * i] = f.x, sc[4 * i + 1] = f.y, sc[4 * i + 2] = f.z, sc[4 * i + 3] = f.w;
      }
    } else {
      const float one =
          a.scale_mode == static_cast<int>(ScaleMode::kPerToken) ? scales[row] : scales[h];
#pragma unroll
      for (int i = 0; i < 16; ++i) sc[i] = one;
    }
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint4 out[2];
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t word = w[i / 2] >> (16 * (i % 2));
      const float x0 = Decode8<kFp8>(word & 0xffu) * sc[2 * i];
      const float x1 = Decode8<kFp8>((word >> 8) & 0xffu) * sc[2 * i + 1];
      const __nv_bfloat162 pair = __floats2bfloat162_rn(x0, x1);
      o[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    reinterpret_cast<uint4*>(dst)[0] = out[0];
    reinterpret_cast<uint4*>(dst)[1] = out[1];
  }
}

template <int D>
void LaunchDequant(const DequantArgs& a, bool fp8, cudaStream_t s) {
  const dim3 grid((a.max_kv + kDequantTokens - 1) / kDequantTokens, a.num_seqs);
  if (fp8) {
    DequantKvKernel<D, true><<<grid, 256, 0, s>>>(a);
  } else {
    DequantKvKernel<D, false><<<grid, 256, 0, s>>>(a);
  }
}

}  // namespace

void LaunchDequantKv(const DequantArgs& a, CacheType cache, int head_dim, void* stream) {
  if (a.num_seqs == 0 || a.max_kv == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const bool fp8 = cache == CacheType::kFp8E4M3;
  if (head_dim == 64) {
    LaunchDequant<64>(a, fp8, s);
  } else {
    LaunchDequant<128>(a, fp8, s);
  }
}

}  // namespace llm::cuda::detail
