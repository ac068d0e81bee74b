// The weighted combine of the MoE layer (LaunchMoeCombine, kernels/cuda/moe/moe_ops.h): its
// arithmetic on 8 columns of one token, shared by the combine kernel (moe_permute.cu) and the
// down GEMMs that finish a small batch's combine themselves (MoeGemmArgs::combine; moe_gemm.cu,
// moe_gemm_mxfp4.cu), so both write the same bits (internal; CUDA translation units).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda::moe_combine {

// out[t, col .. col + 8) = bf16(sum_k topk_w[t, k] y[slot_of[t, k], ...] (fp32, k order) +
// shared[t, ...]). y and shared are read past L1 (another CTA of the same kernel may have written
// them).
__device__ __forceinline__ void CombineChunk(const __nv_bfloat16* y, const int32_t* slot_of,
                                             const float* topk_w, const __nv_bfloat16* shared,
                                             int num_slots, int top_k, int hidden, int t, int col,
                                             __nv_bfloat16* out) {
  float acc[8] = {};
  for (int k = 0; k < top_k; ++k) {
    const int s = slot_of[t * top_k + k];
    if (s >= num_slots) continue;
    const float wt = topk_w[t * top_k + k];
    const uint4 u =
        __ldcg(reinterpret_cast<const uint4*>(y + static_cast<size_t>(s) * hidden + col));
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      acc[2 * j] += wt * f.x;
      acc[2 * j + 1] += wt * f.y;
    }
  }
  if (shared) {
    const uint4 u =
        __ldcg(reinterpret_cast<const uint4*>(shared + static_cast<size_t>(t) * hidden + col));
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      acc[2 * j] += f.x;
      acc[2 * j + 1] += f.y;
    }
  }
  uint4 o;
  auto* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int j = 0; j < 4; ++j) oh[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
  *reinterpret_cast<uint4*>(out + static_cast<size_t>(t) * hidden + col) = o;
}

// The end of a down-GEMM CTA that wrote y (and the dense group's rows) for output columns
// [col0, col0 + cols) of column block `block`, with c.out set: every CTA of the block's
// `num_tiles` tiles draws a ticket after its stores; the last one combines those columns of every
// token (no CTA waits for another; it resets the ticket for the next launch). Every thread of
// the CTA calls it.
__device__ __forceinline__ void CombineAfterTile(const MoeGemmArgs::Combine& c,
                                                 const __nv_bfloat16* y, int hidden, int block,
                                                 int col0, int cols, int num_tiles) {
  __threadfence();  // this thread's stores of y, before the CTA's ticket
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0)
    last = atomicAdd(c.tickets + block, 1u) == static_cast<unsigned>(num_tiles) - 1;
  if (!__syncthreads_or(last)) return;
  __threadfence();  // the other tiles' stores, fenced before their tickets
  if (threadIdx.x == 0) c.tickets[block] = 0;
  const int chunks = cols / 8, S = c.num_tokens * c.top_k;
  for (int i = threadIdx.x; i < c.num_tokens * chunks; i += blockDim.x) {
    const int t = i / chunks, col = col0 + 8 * (i % chunks);
    CombineChunk(y, c.slot_of, c.topk_w, static_cast<const __nv_bfloat16*>(c.shared), S, c.top_k,
                 hidden, t, col, static_cast<__nv_bfloat16*>(c.out));
  }
}

}  // namespace llm::cuda::moe_combine
