#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>

#include "grammar/token_walk.h"

namespace llm::grammar {

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), arena_(&grammar_->grammar()) {
  history_.push_back(Step{arena_.InternState(arena_.Initial()), false});
}

bool Matcher::CanTerminate() const {
  return !history_.back().terminated && arena_.IsDone(history_.back().state);
}

void Matcher::FillNextTokenBitmask(uint32_t* mask) {
  const Vocabulary& vocab = grammar_->vocab();
  std::memset(mask, 0, vocab.mask_words() * sizeof(uint32_t));
  if (IsTerminated()) return;
  ++stats_.masks;
  uint32_t state = history_.back().state;
  const State tops = arena_.StateOf(state);  // a copy: the walks below add states to the arena
  auto hit = memo_.find(state);
  if (hit != memo_.end()) {
    ++stats_.memo_hits;
    std::memcpy(mask, hit->second.data(), hit->second.size() * sizeof(uint32_t));
    return;
  }
  for (uint32_t top : tops) {
    if (top == StackArena::kDone) {
      for (int32_t id : vocab.eos_ids()) mask[id >> 5] |= 1u << (id & 31);
      continue;
    }
    const TokenCacheEntry& entry = grammar_->CacheFor(arena_.PosOf(top));
    entry.AddAccepted(mask);
    // Uncertain tokens need the real stack below this top: first the verdicts of the site where
    // it resumes once the top's rule returns, then a walk of those that reach past that too.
    if (entry.uncertain.empty()) continue;
    const size_t n = entry.uncertain.size();
    const int32_t* walk = entry.uncertain.data();
    size_t num_walk = n;
    const std::vector<uint32_t>* skip = entry.skip;
    const uint32_t parent = arena_.ParentOf(top);
    if (!entry.sites.empty() && parent != StackArena::kDone) {
      const uint32_t site = arena_.PosOf(parent) + 1;
      auto it = std::lower_bound(entry.sites.begin(), entry.sites.end(), site);
      if (it != entry.sites.end() && *it == site) {
        const uint8_t* row = entry.site_verdicts.data() + (it - entry.sites.begin()) * n;
        walk_.clear();
        for (size_t i = 0; i < n; ++i) {
          int32_t id = entry.uncertain[i];
          if (row[i] == TokenCacheEntry::kAccept) mask[id >> 5] |= 1u << (id & 31);
          if (row[i] == TokenCacheEntry::kWalk) walk_.push_back(id);
        }
        walk = walk_.data();
        num_walk = walk_.size();
        skip = nullptr;
      }
    }
    if (num_walk == 0) continue;
    uint32_t start = arena_.InternState(State{top});
    WalkTokens(
        arena_, vocab, start, walk, num_walk, /*isolated=*/false,
        [&](size_t i, TokenVerdict v) {
          if (v == TokenVerdict::kAccepted) mask[walk[i] >> 5] |= 1u << (walk[i] & 31);
        },
        skip);
  }
  // Special tokens, in grammars that allow them: few, and most die on their first byte.
  if (grammar_->grammar().special_tokens()) {
    for (int32_t id : vocab.special_ids()) {
      uint32_t s = state;
      for (char c : vocab.token(id)) {
        s = arena_.Step(s, static_cast<uint8_t>(c));
        if (s == StackArena::kDead) break;
      }
      if (s != StackArena::kDead) mask[id >> 5] |= 1u << (id & 31);
    }
  }
  constexpr size_t kMemoStates = 64;
  if (memo_.size() >= kMemoStates) memo_.clear();
  memo_.emplace(state, std::vector<uint32_t>(mask, mask + vocab.mask_words()));
}

bool Matcher::AcceptString(std::string_view bytes) {
  if (IsTerminated()) return false;
  uint32_t s = history_.back().state;
  for (char c : bytes) {
    s = arena_.Step(s, static_cast<uint8_t>(c));
    if (s == StackArena::kDead) return false;
  }
  history_.push_back(Step{s, false});
  return true;
}

bool Matcher::AcceptToken(int32_t id) {
  const Vocabulary& vocab = grammar_->vocab();
  if (id < 0 || id >= static_cast<int32_t>(vocab.size()) || IsTerminated()) return false;
  if (vocab.IsEos(id)) {
    if (!CanTerminate()) return false;
    history_.push_back(Step{history_.back().state, true});
    return true;
  }
  // Empty tokens never match; special ones only in grammars that allow them.
  if (!vocab.IsOrdinary(id) && !(vocab.IsSpecial(id) && grammar_->grammar().special_tokens())) {
    return false;
  }
  return AcceptString(vocab.token(id));
}

void Matcher::Rollback(int k) {
  int keep = std::max(1, static_cast<int>(history_.size()) - std::max(0, k));
  history_.resize(keep);
}

}  // namespace llm::grammar
