// What the two GEMV kernels of the MoE layer share (LaunchMoeGemv, kernels/cuda/moe/moe_ops.h):
// the weight loads and the column blocks of the fused combine (internal; CUDA translation units).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/gemv_loads.cuh"
#include "kernels/cuda/moe/moe_combine.cuh"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda::moe_gemv {

// Warps per CTA of both GEMVs, and the MXFP4 form's output columns per CTA (the bf16 / fp8 form's
// CTA has kCtaCols times its columns per warp); a combine block (kMoeGemvColumnBlock) is whole
// CTAs of every tile.
constexpr int kCtaCols = 8;
static_assert(kMoeGemvColumnBlock % kCtaCols == 0, "a combine block is whole CTAs");

using ptx::LoadStream16;  // kernels/cuda/common/gemv_loads.cuh

// The end of a down GEMV's CTA (columns [col0, + cols) of y written for its tile, cols dividing
// kMoeGemvColumnBlock): the CTAs of every tile in the column block draw its ticket, and the last
// one combines the block's columns for every token (moe_combine.cuh: LaunchMoeCombine's bits).
// Every thread of the CTA calls it.
__device__ __forceinline__ void CombineAfterCta(const MoeGemmArgs& a, int col0, int cols) {
  const int block = col0 / kMoeGemvColumnBlock, ctas_per_block = kMoeGemvColumnBlock / cols;
  moe_combine::CombineAfterTile(a.combine, static_cast<const __nv_bfloat16*>(a.out), a.n_out, block,
                                block * kMoeGemvColumnBlock, kMoeGemvColumnBlock,
                                *a.num_tiles * ctas_per_block);
}

// The MXFP4 GEMVs (moe_gemv_mxfp4.cu), for LaunchMoeGemv once it has checked the operands.
void LaunchMxfp4(const MoeGemmArgs& a, cudaStream_t stream);

}  // namespace llm::cuda::moe_gemv
