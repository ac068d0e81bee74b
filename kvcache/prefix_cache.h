// Prefix cache over full KV blocks. A block's key chains its parent's key with its own tokens,
// so equal keys mean equal whole prefixes. Shared blocks are reference counted by the allocator;
// cached blocks whose last user ended stay on the allocator's free list (LRU) and can be revived
// by a hit until the allocator hands them out again (eviction).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/block_allocator.h"

namespace llm {

struct PrefixCacheStats {
  int64_t queries = 0;    // blocks looked up
  int64_t hits = 0;       // blocks found
  int64_t evictions = 0;  // cached blocks reused for new content
};

class PrefixCache {
 public:
  PrefixCache(BlockAllocator* allocator, int block_size);

  static uint64_t HashBlock(uint64_t parent, std::span<const int32_t> tokens);

  // Looks up the longest cached run of full blocks covering a prefix of tokens[0, max_tokens);
  // acquires each hit and appends it to *blocks and its key to *keys. Returns the tokens covered.
  int Match(std::span<const int32_t> tokens, int max_tokens, std::vector<int32_t>* blocks,
            std::vector<uint64_t>* keys);
  // Publishes a full, computed block under `key` (no-op if the key is already cached).
  void Insert(uint64_t key, int32_t block, std::span<const int32_t> tokens);

  int num_cached_blocks() const { return static_cast<int>(by_key_.size()); }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    int32_t block;
    std::vector<int32_t> tokens;  // verified on every hit: a hash collision can never alias
  };
  void Evict(int32_t block);

  BlockAllocator* allocator_;
  int block_size_;
  std::unordered_map<uint64_t, Entry> by_key_;
  std::unordered_map<int32_t, uint64_t> key_of_block_;
  PrefixCacheStats stats_;
};

}  // namespace llm
