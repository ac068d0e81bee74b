// The stable counting sort of the (token, k) slots by expert on one CTA (LaunchMoePermute,
// kernels/cuda/moe/moe_ops.h), shared by the permutation kernel (moe_permute.cu) and the fused
// small-batch routing (moe_route_fused.cu) (internal; CUDA translation units).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda::moe_permute {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;  // the CTA PermuteSlots runs on
static_assert(kThreads >= kMoeRouteMaxExperts, "one thread per expert in the scans");

// The shared memory PermuteSlots works in.
struct Smem {
  int base[kWarps][kMoeRouteMaxExperts];  // counts, then running bases
  int warp[kWarps + 1];
};

// Exclusive prefix sum of v over the CTA (thread order); *total gets the sum.
__device__ __forceinline__ int BlockExclusiveScan(int v, int* s_warp, int* total) {
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
    for (int w = 0; w < kWarps; ++w) {
      const int c = s_warp[w];
      s_warp[w] = run;
      run += c;
    }
    s_warp[kWarps] = run;
  }
  __syncthreads();
  const int r = s_warp[warp] + x - v;
  *total = s_warp[kWarps];
  __syncthreads();  // s_warp is reused by the next scan
  return r;
}

// Stable counting sort, one CTA of kThreads threads (all of them call it): each warp owns a
// contiguous range of slots and counts (then places) its range's slots per expert in slot order;
// the experts' bases are laid out expert by expert, warp by warp, so the order within an expert is
// the slot order. No float atomics; the integer counts are exact whatever the order. a.topk_ids
// may have been written by this CTA before a __syncthreads.
__device__ __forceinline__ void PermuteSlots(const MoePermuteArgs& a, Smem& sm) {
  const int S = a.num_slots, E = a.num_experts;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kWarps * kMoeRouteMaxExperts; i += kThreads) {
    (&sm.base[0][0])[i] = 0;
  }
  __syncthreads();
  const int chunk = (S + kWarps * 32 - 1) / (kWarps * 32) * 32;
  const int begin = warp * chunk, end = min(S, begin + chunk);
  int* base = sm.base[warp];
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
    for (int w = 0; w < kWarps; ++w) count += sm.base[w][e];
  }
  const int tr = a.tile_rows;
  const int ntiles = (count + tr - 1) / tr;
  int total_slots, total_tiles;
  const int offset = BlockExclusiveScan(count, sm.warp, &total_slots);
  const int first_tile = BlockExclusiveScan(ntiles, sm.warp, &total_tiles);
  if (a.expert_offsets != nullptr) {
    if (e < E) a.expert_offsets[e] = offset;
    if (threadIdx.x == 0) a.expert_offsets[E] = total_slots;
  }
  if (e < E) {
    int run = offset;
    for (int w = 0; w < kWarps; ++w) {
      const int c = sm.base[w][e];
      sm.base[w][e] = run;
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
  for (int j = threadIdx.x; j < dense_tiles; j += kThreads) {
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

}  // namespace llm::cuda::moe_permute
