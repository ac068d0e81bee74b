// A grammar bound to a vocabulary, shared by every request that uses it. It holds the per-position
// token cache (token_cache.h). Create computes the entries of every position a stack top can
// stand on (up to a budget), so filling a mask reads them without a lock; positions past the
// budget are computed on first use under a mutex. Entries never change, so matchers on any thread
// share them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_cache.h"
#include "grammar/vocabulary.h"

namespace llm::grammar {

class CompiledGrammar {
 public:
  // A null vocabulary is allowed: such a grammar only advances by raw bytes (AcceptString).
  static std::shared_ptr<const CompiledGrammar> Create(std::shared_ptr<const Grammar> grammar,
                                                       std::shared_ptr<const Vocabulary> vocab);
  // precompute_budget: see kPrecomputeTokenBudget (0: every entry on first use).
  static std::shared_ptr<const CompiledGrammar> Create(std::shared_ptr<const Grammar> grammar,
                                                       std::shared_ptr<const Vocabulary> vocab,
                                                       uint64_t precompute_budget);
  // Create computes the entries of the stack-top positions of rules reachable from the root
  // until this many tokens were walked past their first byte (a bound on compile
  // time for very large grammars); the rest are computed on first use.
  static constexpr uint64_t kPrecomputeTokenBudget = 24'000'000;
  // Threads Create uses for those entries (fewer on a machine with fewer cores).
  static constexpr size_t kMaxCompileThreads = 4;

  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }
  const TokenCacheEntry& CacheFor(uint32_t pos) const;
  // Entries computed so far: at Create and on first use.
  size_t cached_positions() const;

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  // Written by Create only, then read without a lock.
  std::vector<std::unique_ptr<TokenCacheEntry>> precomputed_;  // by position; null if not
  mutable std::mutex mu_;
  mutable std::unordered_map<uint32_t, std::unique_ptr<TokenCacheEntry>> lazy_;
};

}  // namespace llm::grammar
