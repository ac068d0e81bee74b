#include "kvcache/block_allocator.h"

namespace llm {

BlockAllocator::BlockAllocator(int num_blocks) : num_blocks_(num_blocks), refs_(num_blocks, 0) {
  LLM_CHECK(num_blocks > 0);
  for (int i = 0; i < num_blocks; ++i) free_.push_back(i);
}

Status BlockAllocator::Allocate(int n, std::vector<int32_t>* out) {
  LLM_CHECK_GE(n, 0);
  if (n > num_free()) {
    return ResourceExhausted("need " + std::to_string(n) + " KV blocks, " +
                             std::to_string(num_free()) + " free");
  }
  for (int i = 0; i < n; ++i) {
    const int32_t b = free_.front();
    free_.pop_front();
    LLM_CHECK_EQ(refs_[b], 0) << "block on the free list is referenced";
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

void BlockAllocator::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    LLM_CHECK(b >= 0 && b < num_blocks_);
    LLM_CHECK(refs_[b] > 0) << "double free of block " << b;
    if (--refs_[b] == 0) free_.push_back(b);
  }
}

}  // namespace llm
