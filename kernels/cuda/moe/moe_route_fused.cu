// The router GEMM, the routing and the permutation of a small batch in one launch
// (kernels/cuda/moe/moe_ops.h, LaunchMoeRouteFused).
//
// At decode sizes the unfused path is three latency-bound launches (cuBLAS's fp32 GEMM, one warp
// per token, one CTA for the sort), each paying a launch, a ramp and a drain for a few
// microseconds of work. Here:
//
//   1. Logits, spread over the GPU: CTA (g, s) of a ceil(E / 16) x ceil(hidden / 256) grid takes
//      experts [16 g, 16 g + 16) (one per warp) and router columns [256 s, 256 s + 256) (two
//      float4 per lane). The router rows are constant, so each lane issues its loads before the
//      PDL wait and the fetch overlaps the previous kernel's tail; every CTA has its 16 KB in
//      flight at once, so the whole router (1 MB for Qwen3-30B-A3B's 128 x 2048, 64 CTAs) arrives
//      in about one memory round trip. x's columns [256 s, 256 s + 256) of every token sit in
//      shared memory; each warp writes one partial dot product per token into `partials`.
//   2. The last CTA finishes. The logits need every column of a row and the routing every expert
//      of a token, so the partial sums must meet somewhere: a second launch is what this kernel
//      removes, and a grid-wide barrier would need every CTA resident at once. Instead each CTA
//      fences its partials and takes a ticket (atomicAdd); the one that draws the last ticket
//      knows every partial is written, so it alone sums them (split order: the same bits on every
//      run, whatever the CTAs' schedule), routes every token (moe_route.cuh, 8 warps) and sorts the
//      slots (moe_permute.cuh, all 16 warps), exactly as LaunchMoeRoute and LaunchMoePermute.
//      Nobody waits for anybody, and the last CTA puts the ticket back to zero, so graph replays
//      find it as the first launch did.
//
// The token limit (kMoeRouteFusedMaxTokens = 16): step 1 grows slowly with T (T x 256 floats of
// x in shared memory, T dot products per lane on weights already in registers), but the last
// CTA's serial work grows linearly: splits x T x E partial sums, T / 8 routing rounds per warp and
// the sort of T x top_k slots, all on one SM. Past a decode batch that tail outweighs the launches
// saved, and the unfused path spreads the routing over T / 4 CTAs and the GEMM over the GPU.
//
// The logits are not cuBLAS's bits (another summation order), so this path and the unfused one
// may route a near-tie token differently; each is deterministic.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_permute.cuh"
#include "kernels/cuda/moe/moe_route.cuh"

namespace llm::cuda {
namespace {

constexpr int kThreads = moe_permute::kThreads;  // the sort's CTA
constexpr int kRows = kThreads / 32;             // experts per CTA, one per warp
constexpr int kCols = kMoeRouteFusedCols;
constexpr int kMaxT = kMoeRouteFusedMaxTokens;
constexpr int kRouteWarps = 8;  // tokens routed at once (shared memory: 2 x 2 KB each)
static_assert(kCols == 2 * 32 * 4, "two float4 of the router row per lane");

union alignas(16) Smem {  // float4 accesses to x
  float x[kMaxT][kCols];  // step 1: x's columns of this CTA, every token
  struct {
    float score[kRouteWarps][kMoeRouteMaxExperts];
    float choice[kRouteWarps][kMoeRouteMaxExperts];
  } route;
  moe_permute::Smem permute;
};

__global__ void __launch_bounds__(kThreads) MoeRouteFusedKernel(const MoeRouteFusedArgs a) {
  __shared__ Smem sm;
  __shared__ int s_last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = a.route.num_tokens, E = a.route.num_experts, H = a.hidden;
  const int e = blockIdx.x * kRows + warp;
  const int k0 = blockIdx.y * kCols;
  // The router's columns [k0 + 128 j + 4 lane, + 4): written at load, so read before the wait.
  float4 w[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int c = k0 + 128 * j + 4 * lane;
    w[j] = e < E && c < H
               ? __ldg(reinterpret_cast<const float4*>(a.router + static_cast<size_t>(e) * H + c))
               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  ptx::GridDependencySync();  // launched with LaunchPdl; x comes from the kernel before
  for (int i = threadIdx.x; i < T * (kCols / 4); i += kThreads) {
    const int t = i / (kCols / 4), c = 4 * (i % (kCols / 4));
    *reinterpret_cast<float4*>(&sm.x[t][c]) =
        k0 + c < H ? *reinterpret_cast<const float4*>(a.x + static_cast<size_t>(t) * H + k0 + c)
                   : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();
  if (e < E) {  // whole warps
    float acc[kMaxT];
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      acc[t] = 0.f;
      if (t < T) {
        const float4 xa = *reinterpret_cast<const float4*>(&sm.x[t][4 * lane]);
        const float4 xb = *reinterpret_cast<const float4*>(&sm.x[t][128 + 4 * lane]);
        float v = w[0].x * xa.x;
        v = fmaf(w[0].y, xa.y, v);
        v = fmaf(w[0].z, xa.z, v);
        v = fmaf(w[0].w, xa.w, v);
        v = fmaf(w[1].x, xb.x, v);
        v = fmaf(w[1].y, xb.y, v);
        v = fmaf(w[1].z, xb.z, v);
        acc[t] = fmaf(w[1].w, xb.w, v);
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) {
      if (t < T) acc[t] = moe_route::WarpSum(acc[t]);
    }
    if (lane == 0) {
      float* p = a.partials + static_cast<size_t>(blockIdx.y) * T * E + e;
#pragma unroll
      for (int t = 0; t < kMaxT; ++t) {
        if (t < T) p[static_cast<size_t>(t) * E] = acc[t];
      }
    }
  }
  // Publish the partials, then draw a ticket; the last CTA of the grid goes on.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned ctas = gridDim.x * gridDim.y;
    s_last = atomicAdd(a.ticket, 1u) == ctas - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();                      // the other CTAs' partials, fenced before their tickets
  if (threadIdx.x == 0) *a.ticket = 0;  // every CTA has drawn: ready for the next launch
  const int splits = gridDim.y;
  for (int i = threadIdx.x; i < T * E; i += kThreads) {
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += __ldcg(a.partials + static_cast<size_t>(s) * T * E + i);
    a.logits[i] = v;
  }
  __syncthreads();  // logits visible to the CTA; x's shared memory free
  MoeRouteArgs ra = a.route;
  ra.logits = a.logits;
  if (warp < kRouteWarps) {
    for (int t = warp; t < T; t += kRouteWarps) {
      moe_route::RouteToken(ra, t, lane, sm.route.score[warp], sm.route.choice[warp]);
    }
  }
  __syncthreads();  // topk_ids visible to the CTA; the routing's shared memory free
  MoePermuteArgs pa = a.permute;
  pa.topk_ids = ra.topk_ids;
  moe_permute::PermuteSlots(pa, sm.permute);
}

}  // namespace

bool LaunchMoeRouteFused(const MoeRouteFusedArgs& a, void* stream) {
  if (!MoeRouteFusedOk(a.route.num_tokens, a.hidden)) return false;
  const dim3 grid((a.route.num_experts + kRows - 1) / kRows, MoeRouteFusedSplits(a.hidden));
  (void)LaunchPdl(MoeRouteFusedKernel, grid, dim3(kThreads), 0, static_cast<cudaStream_t>(stream),
                  a);
  return true;
}

}  // namespace llm::cuda
