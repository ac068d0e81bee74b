// Rotary embedding ("rotate_half" pairs (i, i + D/2)) over one row of a fused q/k/v projection,
// four pairs per thread, and the per-head q/k RMSNorm before it: shared by the model's BiasRope
// and q/k-norm rotary kernels (elementwise_ops.cu) and the C8 append with the rotary fused in
// (c8_append.cu), so all store the same bits. Same float math as the CPU oracle: angle =
// pos * inv_freq in fp32, cos/sin in fp32, and every product and sum rounded on its own (explicit
// _rn operations: the compiler may not contract them into FMAs differently in different kernels).
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/common/ptx_ops.cuh"

namespace llm::cuda::rope {

// cs[0, half) = cos, cs[half, 2 half) = sin of the token's angles, filled by the CTA's threads
// (__syncthreads() before reading it).
__device__ __forceinline__ void FillAngles(float pos, const float* inv_freq, int half, float* cs) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    sincosf(pos * inv_freq[i], &cs[half + i], &cs[i]);
  }
}

// Columns c1..c1+3 and c1+half..c1+half+3 of a projection row (8-byte aligned), times the row
// scale, plus the bias (null: none).
__device__ __forceinline__ void LoadPairs(const __nv_bfloat16* row, const __nv_bfloat16* bias,
                                          int c1, int half, float rs, float (&x1)[4],
                                          float (&x2)[4]) {
  float b1[4] = {0.f, 0.f, 0.f, 0.f}, b2[4] = {0.f, 0.f, 0.f, 0.f};
  ptx::LoadBf16x4(row + c1, x1);
  ptx::LoadBf16x4(row + c1 + half, x2);
  if (bias) {
    ptx::LoadBf16x4(bias + c1, b1);
    ptx::LoadBf16x4(bias + c1 + half, b2);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x1[j] = __fadd_rn(__fmul_rn(x1[j], rs), b1[j]);
    x2[j] = __fadd_rn(__fmul_rn(x2[j], rs), b2[j]);
  }
}

// The sum of squares of pairs i..i+3 (one lane's share of a head's q/k RMSNorm), in a fixed order.
__device__ __forceinline__ float SumSquares(const float (&x1)[4], const float (&x2)[4]) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    ss = __fadd_rn(ss, __fadd_rn(__fmul_rn(x1[j], x1[j]), __fmul_rn(x2[j], x2[j])));
  }
  return ss;
}

// Pairs i..i+3 of a head times inv (its rsqrt(mean(x^2) + eps)) times (offset + w) (w: bf16
// [D], the q or k norm's weights): the q/k RMSNorm before the rotary.
__device__ __forceinline__ void NormPairs(const __nv_bfloat16* w, int i, int half, float inv,
                                          float offset, float (&x1)[4], float (&x2)[4]) {
  float w1[4], w2[4];
  ptx::LoadBf16x4(w + i, w1);
  ptx::LoadBf16x4(w + i + half, w2);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x1[j] = __fmul_rn(__fmul_rn(x1[j], inv), __fadd_rn(offset, w1[j]));
    x2[j] = __fmul_rn(__fmul_rn(x2[j], inv), __fadd_rn(offset, w2[j]));
  }
}

// Rotates pairs i..i+3 of a head in place by the angles in cs (FillAngles).
__device__ __forceinline__ void Rotate(const float* cs, int i, int half, float (&x1)[4],
                                       float (&x2)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float c = cs[i + j], sn = cs[half + i + j];
    const float o1 = __fsub_rn(__fmul_rn(x1[j], c), __fmul_rn(x2[j], sn));
    const float o2 = __fadd_rn(__fmul_rn(x2[j], c), __fmul_rn(x1[j], sn));
    x1[j] = o1;
    x2[j] = o2;
  }
}

}  // namespace llm::cuda::rope
