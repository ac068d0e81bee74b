// Split-KV merge and latent append (quantizing for fp8) kernels for MLA decode.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/mla/mla_kernel_args.h"

namespace llm::cuda::mla {
namespace {

constexpr int kMergeThreads = kMlaLatentDim / 4;  // 4 output dims per thread

// One CTA per (merge item, row): out = sum_p w_p o_p / sum_p w_p with w_p = 2^(lse_p - max lse).
// Partial outputs are already normalized within their chunk; a chunk that saw no unmasked
// position has lse -inf and weight 0. The max is a block reduction (not a serial loop of
// dependent loads), and the weighted sum keeps 8 independent loads in flight per thread.
// Graph form (device_num_items): the grid is narrower than the bucket's merge capacity and CTA x
// takes items x, x + gridDim.x, ... below the step's count; an eager grid is the exact count.
__global__ void __launch_bounds__(kMergeThreads) MergeKernel(const MergeArgs a) {
  __shared__ float warp_max[kMergeThreads / 32];
  const int count = a.device_num_items != nullptr ? *a.device_num_items : a.num_items;
  // Every CTA waits, work or not: this kernel's completion then implies the attention kernel's,
  // which the next (non-PDL) launch relies on.
  MlaMergeItem item = static_cast<int>(blockIdx.x) < count ? a.items[blockIdx.x] : MlaMergeItem{};
  ptx::GridDependencyWait();  // launched early: the partials are the attention kernel's output
  for (int i = blockIdx.x; i < count; i += gridDim.x) {
    if (i != static_cast<int>(blockIdx.x)) item = a.items[i];
    const int r = blockIdx.y;
    if (r >= item.q_len * item.num_heads) continue;  // uniform over the CTA
    const int n = item.num_partials;
    const float* lse = a.partial_lse + static_cast<size_t>(item.first_partial) * kMlaMaxRows + r;
    float m = -INFINITY;
    for (int p = threadIdx.x; p < n; p += kMergeThreads) m = fmaxf(m, lse[p * kMlaMaxRows]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kMergeThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    __syncthreads();  // warp_max is rewritten by the next item
    const float m_use = m == -INFINITY ? 0.f : m;
    const int d = threadIdx.x * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float sum = 0.f;
    const float* o = a.partial_o +
                     (static_cast<size_t>(item.first_partial) * kMlaMaxRows + r) * kMlaLatentDim +
                     d;
#pragma unroll 8
    for (int p = 0; p < n; ++p) {
      const float w = exp2f(lse[p * kMlaMaxRows] - m_use);
      const float4 v = *reinterpret_cast<const float4*>(o + static_cast<size_t>(p) * kMlaMaxRows *
                                                                kMlaLatentDim);
      sum += w;
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const size_t qrow = static_cast<size_t>(item.q_start + r / item.num_heads) * a.num_heads +
                        item.head_start + r % item.num_heads;
    auto* out = static_cast<__nv_bfloat16*>(a.out) + qrow * kMlaLatentDim + d;
    reinterpret_cast<__nv_bfloat162*>(out)[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    reinterpret_cast<__nv_bfloat162*>(out)[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  }
}

constexpr int kAppendChunks = kMlaCacheDim / 8;  // 8 elements (16 bf16 bytes) per thread

// One CTA per token: copies (bf16) or quantizes (fp8) its 576-wide latent into its cache slot.
// fp8 bytes are base/quant.h's QuantizeFp8: e4m3(x / scale) from the one correctly rounded
// fp32 quotient, round to nearest even, saturating to +-448, NaN -> 0x7f (cvt.rn.satfinite).
template <bool kFp8>
__global__ void AppendKernel(const AppendArgs a) {
  const int tok = blockIdx.x, c = threadIdx.x;
  const int slot = a.slots[tok];
  if (c >= kAppendChunks || slot < 0) return;
  const uint4 in = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.latent_new) +
                                                  static_cast<size_t>(tok) * kMlaCacheDim)[c];
  const size_t row = static_cast<size_t>(slot) * kMlaCacheDim;
  if constexpr (!kFp8) {
    reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.cache) + row)[c] = in;
  } else {
    const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&in);
    uint8_t b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      b[i] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(__bfloat162float(x[i]) / a.cache_scale, __NV_SATFINITE, __NV_E4M3));
    }
    reinterpret_cast<uint2*>(static_cast<uint8_t*>(a.cache) + row)[c] =
        *reinterpret_cast<const uint2*>(b);
  }
}

}  // namespace

void LaunchMerge(const MergeArgs& a, int rows, void* stream) {
  if (a.num_items == 0) return;
  (void)LaunchPdl(MergeKernel, dim3(a.num_items, rows), dim3(kMergeThreads), 0,
                  static_cast<cudaStream_t>(stream), a);
}

void LaunchAppend(const AppendArgs& a, MlaCacheType cache, void* stream) {
  if (a.num_tokens == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (cache == MlaCacheType::kFp8E4M3) {
    AppendKernel<true><<<a.num_tokens, 96, 0, s>>>(a);
  } else {
    AppendKernel<false><<<a.num_tokens, 96, 0, s>>>(a);
  }
}

}  // namespace llm::cuda::mla
