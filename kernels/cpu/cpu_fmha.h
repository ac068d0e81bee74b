// CPU reference of the paged-KV FMHA family (kernels/fmha/fmha_params.h): the oracle the
// CUDA/HIP kernel is tested against. Semantics are exactly those written in fmha_params.h.
#pragma once

#include "kernels/fmha/fmha_params.h"

namespace llm {

// Reference forward over host pointers; q/k/v read as p.dtype (bf16 or fp16 bits) and widened to
// fp32; all math in fp32. Writes out_f32 [total_q, num_q_heads, head_dim] and, if p.lse is set,
// p.lse. p.out is ignored. Keys no query row of a sequence can see are never read, so K/V blocks
// (or cache rows) outside every window may hold anything.
void CpuFmhaForward(const FmhaParams& p, float* out_f32);

// Visibility rule of FmhaMask, shared by the reference and tests: query row i of a sequence with
// seqlen_q rows and seqlen_k keys, key j.
bool FmhaKeyVisible(const FmhaMask& m, int i, int j, int seqlen_q, int seqlen_k);

}  // namespace llm
