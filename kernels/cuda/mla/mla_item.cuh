// What every MLA decode kernel derives from its work item (internal, device code): the item's
// rows, the causal position of its first query token, and the q / output row of an item row.
#pragma once

#include <climits>
#include <cstddef>

#include "kernels/cuda/mla/mla_kernel_args.h"

namespace llm::cuda::mla {

struct ItemGeometry {
  int item_rows;  // q_len x num_heads (rows past it are padding)
  int pos0;       // the item's first query token sits here and sees cache positions [0, pos0]
  __device__ ItemGeometry(const AttendArgs& a, const MlaWorkItem& item) {
    item_rows = item.q_len * item.num_heads;
    const int seq_q_begin = a.q_indptr[item.seq];
    const int seq_q_len = a.q_indptr[item.seq + 1] - seq_q_begin;
    pos0 = a.kv_lens[item.seq] - seq_q_len + (item.q_start - seq_q_begin);
  }
  // Causal limit of item row r (heads first, then tokens); padding rows see everything.
  __device__ int RowPos(const MlaWorkItem& item, int r) const {
    return r < item_rows ? pos0 + r / item.num_heads : INT_MAX;
  }
};

// Graph form: whether this CTA lies past the step's item count (AttendArgs::device_num_items).
// Every kernel asks first, before any barrier or shared-memory setup, so surplus CTAs of a
// bucket-sized grid cost only their launch. The count was uploaded before the step's first kernel,
// like the items, so it is read before GridDependencyWait.
__device__ __forceinline__ bool SurplusCta(const AttendArgs& a) {
  return a.device_num_items != nullptr && static_cast<int>(blockIdx.x) >= *a.device_num_items;
}

// KV tiles of `tile` tokens covering the item's range [kv_start, kv_end).
__device__ __forceinline__ int NumTiles(const MlaWorkItem& item, int tile) {
  return (item.kv_end - item.kv_start + tile - 1) / tile;
}

// Row of q_latent / q_pe / out for item row r (heads first, then tokens).
__device__ __forceinline__ size_t QRow(const AttendArgs& a, const MlaWorkItem& item, int r) {
  return static_cast<size_t>(item.q_start + r / item.num_heads) * a.num_heads + item.head_start +
         r % item.num_heads;
}

// The fp8-MMA kernels' q scale: a power of two that puts a row's max |q| (mx) in [128, 256),
// exact and inside e4m3's range (448) with its full precision.
__device__ __forceinline__ float QScaleE4m3(float mx) {
  int e = 0;
  frexpf(mx, &e);  // mx = f 2^e, f in [0.5, 1)
  return mx > 0.f && isfinite(mx) ? ldexpf(1.f, 8 - e) : 1.f;
}

}  // namespace llm::cuda::mla
