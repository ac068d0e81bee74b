#include "kvcache/prefix_cache.h"

#include <algorithm>

namespace llm {

PrefixCache::PrefixCache(BlockAllocator* allocator, int block_size)
    : allocator_(allocator), block_size_(block_size) {
  allocator_->set_eviction_hook([this](int32_t b) { Evict(b); });
}

uint64_t PrefixCache::HashBlock(uint64_t parent, std::span<const int32_t> tokens) {
  // FNV-1a over the parent key and the token ids, then a splitmix64 finalizer.
  uint64_t h = 1469598103934665603ull ^ parent;
  h *= 1099511628211ull;
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

int PrefixCache::Match(std::span<const int32_t> tokens, int max_tokens,
                       std::vector<int32_t>* blocks, std::vector<uint64_t>* keys) {
  uint64_t parent = 0;
  int covered = 0;
  while (covered + block_size_ <= max_tokens) {
    const auto block_tokens = tokens.subspan(covered, block_size_);
    const uint64_t key = HashBlock(parent, block_tokens);
    ++stats_.queries;
    auto it = by_key_.find(key);
    if (it == by_key_.end() ||
        !std::equal(block_tokens.begin(), block_tokens.end(), it->second.tokens.begin())) {
      break;
    }
    ++stats_.hits;
    allocator_->Acquire(it->second.block);
    blocks->push_back(it->second.block);
    keys->push_back(key);
    parent = key;
    covered += block_size_;
  }
  return covered;
}

void PrefixCache::Insert(uint64_t key, int32_t block, std::span<const int32_t> tokens) {
  if (by_key_.count(key) || key_of_block_.count(block)) return;
  by_key_.emplace(key, Entry{block, std::vector<int32_t>(tokens.begin(), tokens.end())});
  key_of_block_.emplace(block, key);
}

void PrefixCache::Evict(int32_t block) {
  auto it = key_of_block_.find(block);
  if (it == key_of_block_.end()) return;
  by_key_.erase(it->second);
  key_of_block_.erase(it);
  ++stats_.evictions;
}

}  // namespace llm
