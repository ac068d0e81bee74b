#include "grammar/compiled_grammar.h"

#include "grammar/token_walk.h"

namespace llm::grammar {

std::shared_ptr<const CompiledGrammar> CompiledGrammar::Create(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab) {
  auto g = std::make_shared<CompiledGrammar>();
  g->grammar_ = std::move(grammar);
  g->vocab_ = vocab ? std::move(vocab) : Vocabulary::Create({}, {});
  return g;
}

const TokenCacheEntry& CompiledGrammar::CacheFor(uint32_t pos) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(pos);
    if (it != cache_.end()) return *it->second;
  }
  // Computed outside the lock: two threads may both compute an entry; the first one stored wins.
  auto entry = std::make_unique<TokenCacheEntry>();
  entry->accepted.assign(vocab_->mask_words(), 0);
  StackArena arena(grammar_.get());
  uint32_t start = arena.InternState(arena.Isolated(pos));
  const auto& ids = vocab_->sorted();
  WalkTokens(
      arena, *vocab_, start, ids.data(), ids.size(), /*isolated=*/true,
      [&](int32_t id, TokenVerdict v) {
        if (v == TokenVerdict::kAccepted) entry->accepted[id >> 5] |= 1u << (id & 31);
        if (v == TokenVerdict::kUncertain) entry->uncertain.push_back(id);
      },
      vocab_->sorted_skip());
  BuildSkipTables(*vocab_, entry->uncertain, entry->skip);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = cache_.try_emplace(pos, std::move(entry));
  return *it->second;
}

size_t CompiledGrammar::cached_positions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

}  // namespace llm::grammar
