// The MoE layer's permutation by expert and its weighted un-permute (kernels/cuda/moe/moe_ops.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
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
    float acc[8] = {};
    for (int k = 0; k < top_k; ++k) {
      const int s = slot_of[t * top_k + k];
      if (s >= num_slots) continue;
      const float wt = topk_w[t * top_k + k];
      const uint4 u = *reinterpret_cast<const uint4*>(y + static_cast<size_t>(s) * hidden + i);
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        acc[2 * j] += wt * f.x;
        acc[2 * j + 1] += wt * f.y;
      }
    }
    if (shared) {
      const uint4 u = *reinterpret_cast<const uint4*>(shared + static_cast<size_t>(t) * hidden + i);
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
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(t) * hidden + i) = o;
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
