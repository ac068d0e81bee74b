// The MoE layer's permutation by expert and its weighted un-permute (kernels/cuda/moe/moe_ops.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_combine.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_permute.cuh"

namespace llm::cuda {
namespace {

__global__ void __launch_bounds__(moe_permute::kThreads) MoePermuteKernel(const MoePermuteArgs a) {
  __shared__ moe_permute::Smem sm;
  ptx::GridDependencySync();  // launched with LaunchPdl
  moe_permute::PermuteSlots(a, sm);
}

// One CTA per token; 8 bf16 per thread and access.
__global__ void MoeCombineKernel(const __nv_bfloat16* y, const int32_t* slot_of,
                                 const float* topk_w, const __nv_bfloat16* shared, int num_slots,
                                 int top_k, int hidden, __nv_bfloat16* out) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int t = blockIdx.x;
  for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8) {
    moe_combine::CombineChunk(y, slot_of, topk_w, shared, num_slots, top_k, hidden, t, i, out);
  }
}

}  // namespace

void LaunchMoePermute(const MoePermuteArgs& a, void* stream) {
  (void)LaunchPdl(MoePermuteKernel, dim3(1), dim3(moe_permute::kThreads), 0,
                  static_cast<cudaStream_t>(stream), a);
}

void LaunchMoeCombine(const void* y, const int32_t* slot_of, const float* topk_w,
                      const void* shared, int num_tokens, int top_k, int hidden, void* out,
                      void* stream) {
  if (num_tokens == 0) return;
  (void)LaunchPdl(MoeCombineKernel, dim3(num_tokens), dim3(256), 0,
                  static_cast<cudaStream_t>(stream), static_cast<const __nv_bfloat16*>(y), slot_of,
                  topk_w, static_cast<const __nv_bfloat16*>(shared), num_tokens * top_k, top_k,
                  hidden, static_cast<__nv_bfloat16*>(out));
}

}  // namespace llm::cuda
