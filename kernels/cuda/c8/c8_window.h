// The index rules of the C8 tile kernel for causal sliding windows (internal to
// c8_tile_kernel.cuh), as inline functions for the host and the device alike, so that
// tests/unit/test_c8_window.cc checks them on the CPU against the reference's definition
// (AttentionParams::window_left: a query at position p sees keys [p - window, p]). Plain C++
// header: no CUDA types.
#pragma once

#if defined(__CUDACC__)
#define LLM_C8_HD __host__ __device__ __forceinline__
#else
#define LLM_C8_HD inline
#endif

namespace llm::cuda {

// The window of a layer without one: every key at or left of the query is visible.
constexpr int kC8NoWindow = 0x7fffffff;

// Whether a query at position pos sees key j: j in [pos - window, pos]. One unsigned compare
// covers both ends: j > pos wraps pos - j to at least 2^31, past any window (positions are
// non-negative ints, so pos - j never overflows).
LLM_C8_HD bool C8KeyVisible(int pos, int j, int window) {
  return static_cast<unsigned>(pos - j) <= static_cast<unsigned>(window);
}

// The first key a work item of KV range [kv_start, kv_end) whose first query sits at q_pos0
// reads: the start of the block (block_mask = block_size - 1, a power of two) holding that
// query's window start, when that is later than kv_start. The scheduler frees only blocks wholly
// left of it (their ids are -1), and every later query's window starts further right. kv_end
// when the whole range is left of the window (the item then reads nothing).
LLM_C8_HD int C8WindowedKvStart(int kv_start, int kv_end, int q_pos0, int window, int block_mask) {
  // q_pos0 - window >= -kC8NoWindow: no overflow, and & ~block_mask floors negatives too.
  int s = (q_pos0 - window) & ~block_mask;
  s = s > kv_start ? s : kv_start;
  return s < kv_end ? s : kv_end;
}

// The KV tiles (of `tile` keys) that need no mask start in [lo, lo + span]: they end inside the
// item's range and at or left of its first query's diagonal, and start at or right of its last
// query's window start (the rightmost). lo -1 with span 0 when no tile qualifies (tile starts
// are never negative).
struct C8UnmaskedTiles {
  int lo = -1;
  int span = 0;
};

LLM_C8_HD C8UnmaskedTiles C8UnmaskedTileStarts(int q_pos0, int q_len, int kv_end, int window,
                                               int tile) {
  C8UnmaskedTiles u;
  const int lo = q_pos0 + q_len - 1 - window;  // >= -kC8NoWindow: no overflow
  u.lo = lo > 0 ? lo : 0;
  const int end = kv_end < q_pos0 + 1 ? kv_end : q_pos0 + 1;
  u.span = end - tile - u.lo;
  if (u.span < 0) {
    u.lo = -1;
    u.span = 0;
  }
  return u;
}

LLM_C8_HD bool C8TileNeedsMask(int tile_base, const C8UnmaskedTiles& u) {
  return static_cast<unsigned>(tile_base - u.lo) > static_cast<unsigned>(u.span);
}

}  // namespace llm::cuda
