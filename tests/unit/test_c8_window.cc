// The C8 tile kernel's sliding-window index rules (kernels/cuda/c8/c8_window.h), checked on the
// CPU against the reference's definition (WindowStart, kernels/cpu/cpu_paged_attention.h) over the
// work items the C8 planner makes: every key a query sees is read, nothing in a block the
// scheduler freed is read, a tile left unmasked holds only keys every query sees, and without a
// window the masking is the causal rule it always was.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <sstream>
#include <string>

#include "kernels/cpu/cpu_paged_attention.h"
#include "kernels/cuda/c8/c8_window.h"

namespace llm::cuda {
namespace {

// The reference: a query at pos sees key j iff WindowStart(pos, window_left) <= j <= pos.
bool Visible(int pos, int j, int window_left) {
  return j <= pos && j >= WindowStart(pos, window_left);
}

struct Failures {
  int count = 0;
  std::string first;
  void Add(const std::string& what) {
    if (count++ == 0) first = what;
  }
};

// One work item: a query tile of q_len tokens from position q_pos0 against keys [kv_start,
// kv_end), of a sequence whose first query this step sits at seq_pos0 (the scheduler frees the
// blocks wholly left of that query's window).
void CheckItem(int q_pos0, int q_len, int kv_start, int kv_end, int seq_pos0, int window_left,
               int block_size, int tile, Failures* f) {
  const int window = window_left < 0 ? kC8NoWindow : window_left;
  std::ostringstream where;
  where << "q_pos0 " << q_pos0 << " q_len " << q_len << " kv [" << kv_start << ", " << kv_end
        << ") window_left " << window_left << " block " << block_size << " tile " << tile;
  const int start = C8WindowedKvStart(kv_start, kv_end, q_pos0, window, block_size - 1);
  if (start < kv_start || start > kv_end) f->Add(where.str() + ": start " + std::to_string(start));
  // The copy mapping needs starts on 16-token boundaries (a thread's rows stay in one block).
  if (start != kv_end && start % 16 != 0) f->Add(where.str() + ": unaligned start");
  const int freed = window_left < 0 ? 0 : std::max(0, seq_pos0 - window_left) / block_size;
  if (start < kv_end && start / block_size < freed) f->Add(where.str() + ": reads a freed block");
  for (int r = 0; r < q_len; ++r) {
    const int pos = q_pos0 + r;
    for (int j = kv_start; j < start; ++j) {
      if (Visible(pos, j, window_left)) f->Add(where.str() + ": skips a visible key");
    }
    for (int j = std::max(0, kv_start - 3); j < kv_end + 3; ++j) {
      if (C8KeyVisible(pos, j, window) != Visible(pos, j, window_left)) {
        f->Add(where.str() + ": C8KeyVisible(" + std::to_string(pos) + ", " + std::to_string(j) +
               ")");
      }
    }
  }
  const C8UnmaskedTiles u = C8UnmaskedTileStarts(q_pos0, q_len, kv_end, window, tile);
  for (int base = start; base < kv_end; base += tile) {
    const bool mask = C8TileNeedsMask(base, u);
    if (window_left < 0) {  // the causal rule before windows existed
      const bool causal = base + tile > kv_end || base + tile - 1 > q_pos0;
      if (mask != causal) f->Add(where.str() + ": causal mask changed at " + std::to_string(base));
    }
    if (mask) continue;
    for (int r = 0; r < q_len; ++r) {
      for (int j = base; j < base + tile; ++j) {
        if (j >= kv_end || !Visible(q_pos0 + r, j, window_left)) {
          f->Add(where.str() + ": unmasked tile at " + std::to_string(base) + " holds key " +
                 std::to_string(j) + " invisible to row " + std::to_string(r));
        }
      }
    }
  }
}

TEST_CASE("C8 window rules read every visible key, no freed block, and mask what they must",
          "[c8_window_rules]") {
  std::mt19937 rng(51);
  Failures f;
  int items = 0, skipped_blocks = 0;
  for (int block_size : {16, 32, 64, 256}) {
    for (int tile : {64, 128}) {
      for (int window_left : {-1, 0, 1, 5, 15, 16, 17, 63, 127, 128, 300}) {
        for (int trial = 0; trial < 24; ++trial) {
          // A sequence's step: q_len queries ending at kv_len, cut into tiles of tile_tokens as
          // the planner does (decode tiles of up to 4 tokens, prefill tiles of 16 or 128), each
          // split into chunks of `chunk` keys from 0 (or whole).
          const int q_len = std::vector<int>{1, 2, 3, 4, 17, 40, 300}[trial % 7];
          const int kv_len = q_len + static_cast<int>(rng() % 900);
          const int tile_tokens = std::vector<int>{1, 2, 4, 16, 128}[rng() % 5];
          const int chunk = std::vector<int>{0, 64, 128, 192, 512}[trial % 5];
          const int seq_pos0 = kv_len - q_len;
          for (int t0 = 0; t0 < q_len; t0 += tile_tokens) {
            const int len = std::min(tile_tokens, q_len - t0);
            const int kv_end = seq_pos0 + t0 + len;
            const int q_pos0 = kv_end - len;
            const int step = chunk == 0 ? kv_end : chunk;
            for (int b = 0; b < kv_end; b += step) {
              const int e = std::min(kv_end, b + step);
              CheckItem(q_pos0, len, b, e, seq_pos0, window_left, block_size, tile, &f);
              const int start = C8WindowedKvStart(
                  b, e, q_pos0, window_left < 0 ? kC8NoWindow : window_left, block_size - 1);
              skipped_blocks += (start - b) / block_size;
              ++items;
            }
          }
        }
      }
    }
  }
  INFO(items << " items, " << f.count << " failures; first: " << f.first);
  CHECK(f.count == 0);
  CHECK(skipped_blocks > 1000);  // windows do move the start, so the checks above bite
}

TEST_CASE("C8KeyVisible at the int range's edges", "[c8_window_rules]") {
  CHECK(C8KeyVisible(0, 0, 0));
  CHECK_FALSE(C8KeyVisible(0, 1, kC8NoWindow));
  CHECK(C8KeyVisible(2147483000, 0, kC8NoWindow));
  CHECK_FALSE(C8KeyVisible(0, 2147483000, kC8NoWindow));
  CHECK_FALSE(C8KeyVisible(100, 94, 5));
  CHECK(C8KeyVisible(100, 95, 5));
  const C8UnmaskedTiles none = C8UnmaskedTileStarts(10, 1, 11, kC8NoWindow, 64);
  CHECK(C8TileNeedsMask(0, none));  // the only tile crosses the diagonal
}

}  // namespace
}  // namespace llm::cuda
