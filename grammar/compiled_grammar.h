// A grammar bound to a vocabulary, shared by every request that uses it. It holds the per-position
// token cache: for a stack top at position p, seen without what lies below it, which tokens are
// accepted whatever the stack holds, which are rejected whatever it holds, and which are uncertain
// (the frame returns mid-token, so the rest depends on the caller). Entries are computed on first
// use and never change, so matchers on any thread share them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/vocabulary.h"

namespace llm::grammar {

struct TokenCacheEntry {
  std::vector<uint32_t> accepted;  // bitmask over token ids
  std::vector<int32_t> uncertain;  // token ids in byte order
  // Skip tables of the uncertain list for its walks (token_walk.h).
  std::vector<uint32_t> skip[kSkipDepth];
};

class CompiledGrammar {
 public:
  // A null vocabulary is allowed: such a grammar only advances by raw bytes (AcceptString).
  static std::shared_ptr<const CompiledGrammar> Create(std::shared_ptr<const Grammar> grammar,
                                                       std::shared_ptr<const Vocabulary> vocab);

  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }
  const TokenCacheEntry& CacheFor(uint32_t pos) const;
  size_t cached_positions() const;

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  mutable std::mutex mu_;
  mutable std::unordered_map<uint32_t, std::unique_ptr<TokenCacheEntry>> cache_;
};

}  // namespace llm::grammar
