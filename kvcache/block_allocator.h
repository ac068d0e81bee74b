// Fixed-size KV block pool: a FIFO free list and a reference count per block.
// Bookkeeping only; the storage lives with the attention backend. Owned by the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/base/status.h"

namespace llm {

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);

  int num_blocks() const { return num_blocks_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks_ - num_free(); }

  // Appends n fresh blocks (refcount 1) to *out, or returns ResourceExhausted and changes nothing.
  Status Allocate(int n, std::vector<int32_t>* out);
  // Adds a reference to a block already in use (sharing).
  void Ref(int32_t block);
  // Drops one reference per block; blocks reaching zero return to the free list.
  void Release(const std::vector<int32_t>& blocks);
  int ref_count(int32_t block) const { return refs_[block]; }

 private:
  int num_blocks_;
  std::deque<int32_t> free_;
  std::vector<int32_t> refs_;
};

// Blocks needed to hold `num_tokens` tokens.
inline int BlocksForTokens(int num_tokens, int block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace llm
