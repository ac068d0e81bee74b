// Fixed-size KV block pool: reference counts and an intrusive free list in LRU order.
// Bookkeeping only; the storage lives with the model. Owned by the engine thread.
//
// Free blocks may still hold cached prefix content (see PrefixCache). Released blocks go to the
// back of the free list and allocation takes from the front, so the least recently freed block is
// evicted first; a prefix-cache hit on a free block takes it out of the list (Acquire).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"

namespace llm {

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);

  int num_blocks() const { return num_blocks_; }
  int num_free() const { return num_free_; }
  int num_used() const { return num_blocks_ - num_free_; }

  // Appends n blocks (refcount 1) to *out, or returns ResourceExhausted and changes nothing.
  // Each block handed out that still held cached content is reported to the eviction hook first.
  Status Allocate(int n, std::vector<int32_t>* out);
  // Adds a reference to a block in use (sharing).
  void Ref(int32_t block);
  // Adds a reference to any block; a free one leaves the free list (prefix-cache hit).
  void Acquire(int32_t block);
  // Drops one reference per block, in the given order; blocks reaching zero join the back of the
  // free list. Callers pass a sequence's blocks tail first so that its prefix outlives its tail.
  void Release(const std::vector<int32_t>& blocks);
  int ref_count(int32_t block) const { return refs_[block]; }
  bool is_free(int32_t block) const { return refs_[block] == 0; }

  // Called with a block that is about to be reused for new content.
  void set_eviction_hook(std::function<void(int32_t)> hook) { evict_ = std::move(hook); }

 private:
  void PushBack(int32_t b);
  void Unlink(int32_t b);

  int num_blocks_;
  int num_free_ = 0;
  std::vector<int32_t> refs_;
  // Doubly linked free list through prev_/next_; head_/tail_ are -1 when empty.
  std::vector<int32_t> prev_, next_;
  int32_t head_ = -1, tail_ = -1;
  std::function<void(int32_t)> evict_;
};

// Blocks needed to hold `num_tokens` tokens.
inline int BlocksForTokens(int num_tokens, int block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace llm
