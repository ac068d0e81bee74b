// The gate / up activation of the MoE layer (the grouped GEMMs' epilogues for bf16, fp8 and MXFP4
// experts, and the large-batch path's activation kernel), as CpuMlp computes it: SiLU(gate) x up,
// or gpt-oss's clamped SwiGLU when limit > 0 (gate clamped above, up on both sides,
// (up + 1) x gate x sigmoid(alpha x gate)).
#pragma once

#include <cuda_runtime.h>

namespace llm::cuda {

__device__ __forceinline__ float MoeGateUp(float gt, float up, float limit, float alpha) {
  if (limit > 0.f) {
    gt = fminf(gt, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return (up + 1.0f) * (gt / (1.0f + expf(-alpha * gt)));
  }
  return gt / (1.0f + expf(-gt)) * up;
}

}  // namespace llm::cuda
