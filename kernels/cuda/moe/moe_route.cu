// MoE routing on the device: one warp per token (kernels/cuda/moe/moe_ops.h, LaunchMoeRoute).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_route.cuh"

namespace llm::cuda {
namespace {

constexpr int kWarps = 4;  // tokens per CTA

__global__ void __launch_bounds__(kWarps * 32) MoeRouteKernel(const MoeRouteArgs a) {
  __shared__ float s_score[kWarps][kMoeRouteMaxExperts];
  __shared__ float s_choice[kWarps][kMoeRouteMaxExperts];
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= a.num_tokens) return;  // whole warps: no CTA barrier below
  moe_route::RouteToken(a, t, lane, s_score[warp], s_choice[warp]);
}

}  // namespace

void LaunchMoeRoute(const MoeRouteArgs& a, void* stream) {
  if (a.num_tokens == 0) return;
  (void)LaunchPdl(MoeRouteKernel, dim3((a.num_tokens + kWarps - 1) / kWarps), dim3(kWarps * 32), 0,
                  static_cast<cudaStream_t>(stream), a);
}

}  // namespace llm::cuda
