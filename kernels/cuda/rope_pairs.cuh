// Rotary embedding ("rotate_half" pairs (i, i + D/2)) over one row of a fused q/k/v projection,
// four pairs per thread: shared by the model's BiasRope kernel (llama_ops.cu), the C8 append with
// rotary fused in (c8_append.cu) and the C8 decode tiles that rotate and append themselves
// (c8_tile_kernel.cuh), so all store the same bits. Same float math as the CPU oracle: angle =
// pos * inv_freq in fp32, cos/sin in fp32, and every product and sum rounded on its own (explicit
// _rn operations: the compiler may not contract them into FMAs differently in different kernels).
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/ptx_ops.cuh"

namespace llm::cuda::rope {

// cs[0, half) = cos, cs[half, 2 half) = sin of the token's angles, filled by the CTA's threads
// (__syncthreads() before reading it).
__device__ __forceinline__ void FillAngles(float pos, const float* inv_freq, int half, float* cs) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    sincosf(pos * inv_freq[i], &cs[half + i], &cs[i]);
  }
}

// One projection element: raw value times the row scale, plus the bias element (0 without one).
__device__ __forceinline__ float ScaleBias(float raw, float rs, float b) {
  return __fadd_rn(__fmul_rn(raw, rs), b);
}
// The rotated pair (x1 at column i, x2 at i + half) for angle (c, sn) = (cos, sin): the first
// half's new value, and the second half's.
__device__ __forceinline__ float RotLo(float x1, float x2, float c, float sn) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn));
}
__device__ __forceinline__ float RotHi(float x1, float x2, float c, float sn) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
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
    x1[j] = ScaleBias(x1[j], rs, b1[j]);
    x2[j] = ScaleBias(x2[j], rs, b2[j]);
  }
}

// Rotates pairs i..i+3 of a head in place by the angles in cs (FillAngles).
__device__ __forceinline__ void Rotate(const float* cs, int i, int half, float (&x1)[4],
                                       float (&x2)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float c = cs[i + j], sn = cs[half + i + j];
    const float o1 = RotLo(x1[j], x2[j], c, sn);
    const float o2 = RotHi(x1[j], x2[j], c, sn);
    x1[j] = o1;
    x2[j] = o2;
  }
}

// Rotated columns d, d + 1 (d even) of one head of a projection row (head_row, its bias head_bias
// or null), bf16-rounded as LoadPairs + Rotate + a bf16 store give them, packed low column first.
__device__ __forceinline__ uint32_t RotatedPairBf16(const __nv_bfloat16* head_row,
                                                    const __nv_bfloat16* head_bias, int d, int half,
                                                    float rs, const float* cs) {
  const int i = d < half ? d : d - half;  // the pair's first-half column
  float o[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float b1 = head_bias ? __bfloat162float(head_bias[i + j]) : 0.f;
    const float b2 = head_bias ? __bfloat162float(head_bias[i + j + half]) : 0.f;
    const float x1 = ScaleBias(__bfloat162float(head_row[i + j]), rs, b1);
    const float x2 = ScaleBias(__bfloat162float(head_row[i + j + half]), rs, b2);
    const float c = cs[i + j], sn = cs[half + i + j];
    o[j] = d < half ? RotLo(x1, x2, c, sn) : RotHi(x1, x2, c, sn);
  }
  return ptx::PackBf16(o[0], o[1]);
}

}  // namespace llm::cuda::rope
