// The MoE layer's permutation by expert and its weighted un-permute (kernels/cuda/moe/moe_ops.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda {
namespace {

constexpr int kPermuteWarps = 16;
constexpr int kPermuteThreads = kPermuteWarps * 32;
static_assert(kPermuteThreads >= kMoeRouteMaxExperts, "one thread per expert in the scans");

// Exclusive prefix sum of v over the CTA (thread order); *total gets the sum.
__device__ int BlockExclusiveScan(int v, int* s_warp, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int w = 0; w < kPermuteWarps; ++w) {
      const int c = s_warp[w];
      s_warp[w] = run;
      run += c;
    }
    s_warp[kPermuteWarps] = run;
  }
  __syncthreads();
  const int r = s_warp[warp] + x - v;
  *total = s_warp[kPermuteWarps];
  __syncthreads();  // s_warp is reused by the next scan
  return r;
}

// Stable counting sort, one CTA: each warp owns a contiguous range of slots and counts (then
// places) its range's slots per expert in slot order; the experts' bases are laid out expert by
// expert, warp by warp, so the order within an expert is the slot order. No float atomics; the
// integer counts are exact whatever the order.
__global__ void __launch_bounds__(kPermuteThreads) MoePermuteKernel(const MoePermuteArgs a) {
  __shared__ int s_base[kPermuteWarps][kMoeRouteMaxExperts];  // counts, then running bases
  __shared__ int s_warp[kPermuteWarps + 1];
  ptx::GridDependencySync();  // launched with LaunchPdl
  const int S = a.num_slots, E = a.num_experts;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kPermuteWarps * kMoeRouteMaxExperts; i += kPermuteThreads) {
    (&s_base[0][0])[i] = 0;
  }
  __syncthreads();
  const int chunk = (S + kPermuteWarps * 32 - 1) / (kPermuteWarps * 32) * 32;
  const int begin = warp * chunk, end = min(S, begin + chunk);
  int* base = s_base[warp];
  for (int b = begin; b < end; b += 32) {
    const int i = b + lane;
    const int e = i < end ? a.topk_ids[i] : -1;
    const bool valid = e >= 0 && e < E;
    const uint32_t peers = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid && lane == 31 - __clz(peers)) base[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  // Thread e: the expert's count and tiles, their prefix sums, then each warp's base.
  const int e = threadIdx.x;
  int count = 0;
  if (e < E) {
    for (int w = 0; w < kPermuteWarps; ++w) count += s_base[w][e];
  }
  const int tr = a.tile_rows;
  const int ntiles = (count + tr - 1) / tr;
  int total_slots, total_tiles;
  const int offset = BlockExclusiveScan(count, s_warp, &total_slots);
  const int first_tile = BlockExclusiveScan(ntiles, s_warp, &total_tiles);
  if (a.expert_offsets != nullptr) {
    if (e < E) a.expert_offsets[e] = offset;
    if (threadIdx.x == 0) a.expert_offsets[E] = total_slots;
  }
  if (e < E) {
    int run = offset;
    for (int w = 0; w < kPermuteWarps; ++w) {
      const int c = s_base[w][e];
      s_base[w][e] = run;
      run += c;
    }
    for (int j = 0; j < ntiles; ++j) {
      int32_t* tile = a.tiles + 3 * (first_tile + j);
      tile[0] = e;
      tile[1] = offset + j * tr;
      tile[2] = offset + count;
    }
  }
  // The dense group's tiles after the experts'.
  const int dense_tiles = (a.dense_rows + tr - 1) / tr;
  for (int j = threadIdx.x; j < dense_tiles; j += kPermuteThreads) {
    int32_t* tile = a.tiles + 3 * (total_tiles + j);
    tile[0] = -1;
    tile[1] = j * tr;
    tile[2] = a.dense_rows;
  }
  if (threadIdx.x == 0) *a.num_tiles = total_tiles + dense_tiles;
  __syncthreads();
  for (int b = begin; b < end; b += 32) {
    const int i = b + lane;
    const int ex = i < end ? a.topk_ids[i] : -1;
    const bool valid = ex >= 0 && ex < E;
    const uint32_t peers = __match_any_sync(0xffffffffu, valid ? ex : -1);
    int pos = S;  // an invalid id: no expert row (the combine skips it)
    if (valid) pos = base[ex] + __popc(peers & ((1u << lane) - 1));
    __syncwarp();
    if (valid && lane == 31 - __clz(peers)) base[ex] += __popc(peers);
    __syncwarp();
    if (i < end) {
      a.slot_of[i] = pos;
      if (valid) a.sorted_token[pos] = i / a.top_k;
    }
  }
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
  (void)LaunchPdl(MoePermuteKernel, dim3(1), dim3(kPermuteThreads), 0,
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
