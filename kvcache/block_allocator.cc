#include "kvcache/block_allocator.h"

namespace llm {

BlockAllocator::BlockAllocator(int num_blocks)
    : num_blocks_(num_blocks), refs_(num_blocks, 0), prev_(num_blocks, -1), next_(num_blocks, -1) {
  LLM_CHECK(num_blocks > 0);
  for (int i = 0; i < num_blocks; ++i) PushBack(i);
}

void BlockAllocator::PushBack(int32_t b) {
  prev_[b] = tail_;
  next_[b] = -1;
  if (tail_ >= 0)
    next_[tail_] = b;
  else
    head_ = b;
  tail_ = b;
  ++num_free_;
}

void BlockAllocator::Unlink(int32_t b) {
  if (prev_[b] >= 0)
    next_[prev_[b]] = next_[b];
  else
    head_ = next_[b];
  if (next_[b] >= 0)
    prev_[next_[b]] = prev_[b];
  else
    tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
  --num_free_;
}

Status BlockAllocator::Allocate(int n, std::vector<int32_t>* out) {
  LLM_CHECK_GE(n, 0);
  if (n > num_free_) {
    return ResourceExhausted("need " + std::to_string(n) + " KV blocks, " +
                             std::to_string(num_free_) + " free");
  }
  for (int i = 0; i < n; ++i) {
    const int32_t b = head_;
    Unlink(b);
    LLM_CHECK_EQ(refs_[b], 0) << "block on the free list is referenced";
    if (evict_) evict_(b);
    refs_[b] = 1;
    out->push_back(b);
  }
  return Status::Ok();
}

void BlockAllocator::Ref(int32_t block) {
  LLM_CHECK(block >= 0 && block < num_blocks_);
  LLM_CHECK(refs_[block] > 0) << "Ref of free block " << block;
  ++refs_[block];
}

void BlockAllocator::Acquire(int32_t block) {
  LLM_CHECK(block >= 0 && block < num_blocks_);
  if (refs_[block] == 0) Unlink(block);
  ++refs_[block];
}

void BlockAllocator::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    LLM_CHECK(b >= 0 && b < num_blocks_);
    LLM_CHECK(refs_[b] > 0) << "double free of block " << b;
    if (--refs_[b] == 0) PushBack(b);
  }
}

}  // namespace llm
