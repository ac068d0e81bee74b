#include "grammar/compiled_grammar.h"

namespace llm::grammar {

std::shared_ptr<const CompiledGrammar> CompiledGrammar::Create(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab) {
  auto g = std::make_shared<CompiledGrammar>();
  g->grammar_ = std::move(grammar);
  g->vocab_ = vocab ? std::move(vocab) : Vocabulary::Create({}, {});
  const auto& pos = g->grammar_->positions();
  g->precomputed_.resize(pos.size());
  if (g->vocab_->sorted().empty()) return g;  // raw bytes only: no masks
  TokenCacheBuilder builder(*g->grammar_, *g->vocab_);
  size_t done = 0;
  for (uint32_t p = 0; p < pos.size() && done < kMaxPrecomputed; ++p) {
    // Closure leaves stack tops only on positions that consume a byte.
    if (pos[p].kind != Position::kByte && pos[p].kind != Position::kByteStar) continue;
    g->precomputed_[p] = builder.Build(p);
    ++done;
  }
  return g;
}

const TokenCacheEntry& CompiledGrammar::CacheFor(uint32_t pos) const {
  if (const TokenCacheEntry* e = precomputed_[pos].get()) return *e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = lazy_.find(pos);
    if (it != lazy_.end()) return *it->second;
  }
  // Computed outside the lock: two threads may both compute an entry; the first one stored wins.
  auto entry = TokenCacheBuilder(*grammar_, *vocab_).Build(pos);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = lazy_.try_emplace(pos, std::move(entry));
  return *it->second;
}

size_t CompiledGrammar::cached_positions() const {
  size_t n = 0;
  for (const auto& e : precomputed_) n += e != nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return n + lazy_.size();
}

}  // namespace llm::grammar
