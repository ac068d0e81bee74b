#include "grammar/token_cache.h"

#include <algorithm>

#include "grammar/token_walk.h"

namespace llm::grammar {

namespace {
constexpr uint32_t kUnset = UINT32_MAX;
// A shared arena keeps every state it met with 1 KiB of transitions each; past this many states a
// builder starts a fresh one, which bounds its memory on large grammars.
constexpr size_t kMaxArenaStates = 1 << 15;
// Rules returning to more sites than this keep their tokens that fit some sites uncertain rather
// than walking each token against every site.
constexpr size_t kMaxSitesChecked = 16;
}  // namespace

TokenCacheBuilder::TokenCacheBuilder(const Grammar& g, const Vocabulary& vocab)
    : g_(g), vocab_(vocab), arena_(std::make_unique<StackArena>(&g)) {
  call_sites_.resize(g.num_rules());
  tail_callers_.resize(g.num_rules());
  follow_state_.assign(g.num_rules(), kUnset);
  sites_.resize(g.num_rules());
  const auto& pos = g.positions();
  for (uint32_t q = 0; q < pos.size(); ++q) {
    if (pos[q].kind != Position::kRef) continue;
    if (pos[q].tail) {
      tail_callers_[pos[q].arg].push_back(g.RuleOf(q));
    } else {
      call_sites_[pos[q].arg].push_back(q + 1);
    }
  }
}

std::vector<uint32_t> TokenCacheBuilder::ReturnSites(uint32_t rule, bool* may_end) const {
  std::vector<uint32_t> sites;
  *may_end = false;
  std::vector<char> seen(g_.num_rules(), 0);
  std::vector<uint32_t> todo{rule};
  seen[rule] = 1;
  while (!todo.empty()) {
    uint32_t r = todo.back();
    todo.pop_back();
    if (r == static_cast<uint32_t>(g_.root())) *may_end = true;
    sites.insert(sites.end(), call_sites_[r].begin(), call_sites_[r].end());
    for (uint32_t c : tail_callers_[r]) {
      if (!seen[c]) {
        seen[c] = 1;
        todo.push_back(c);
      }
    }
  }
  std::sort(sites.begin(), sites.end());
  sites.erase(std::unique(sites.begin(), sites.end()), sites.end());
  return sites;
}

uint32_t TokenCacheBuilder::FollowState(uint32_t rule) {
  if (follow_state_[rule] != kUnset) return follow_state_[rule];
  State all;
  bool may_end = false;
  for (uint32_t q : ReturnSites(rule, &may_end)) {
    State s = arena_->Isolated(q);
    all.insert(all.end(), s.begin(), s.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return follow_state_[rule] = arena_->InternState(all);
}

bool TokenCacheBuilder::RestMayFollow(uint32_t follow, const std::string& tok, size_t from) {
  uint32_t s = follow;
  for (size_t d = from; d < tok.size(); ++d) {
    // A return site's own rule returned: what comes next is beyond this view.
    if (arena_->IsDone(s)) return true;
    s = arena_->Step(s, static_cast<uint8_t>(tok[d]));
    if (s == StackArena::kDead) return false;
  }
  return true;
}

const TokenCacheBuilder::Sites& TokenCacheBuilder::SitesOf(uint32_t rule) {
  if (!sites_[rule]) {
    auto s = std::make_unique<Sites>();
    std::vector<uint32_t> sites = ReturnSites(rule, &s->may_end);
    if (sites.size() <= kMaxSitesChecked) {
      for (uint32_t q : sites) s->states.push_back(arena_->InternState(arena_->Isolated(q)));
    }
    sites_[rule] = std::move(s);
  }
  return *sites_[rule];
}

bool TokenCacheBuilder::RestFits(uint32_t site, const std::string& tok, size_t from) {
  uint32_t s = site;
  for (size_t d = from; d < tok.size() && s != StackArena::kDead; ++d)
    s = arena_->Step(s, static_cast<uint8_t>(tok[d]));
  return s != StackArena::kDead;
}

std::unique_ptr<TokenCacheEntry> TokenCacheBuilder::Build(uint32_t pos) {
  if (arena_->num_states() > kMaxArenaStates) {
    arena_ = std::make_unique<StackArena>(&g_);
    follow_state_.assign(g_.num_rules(), kUnset);
    for (auto& s : sites_) s.reset();
  }
  auto entry = std::make_unique<TokenCacheEntry>();
  entry->accepted.assign(vocab_.mask_words(), 0);
  StackArena& arena = *arena_;
  const uint32_t start = arena.InternState(arena.Isolated(pos));
  const auto& ids = vocab_.sorted();
  std::vector<int32_t> uncertain;
  WalkTokens(
      arena, vocab_, start, ids.data(), ids.size(), /*isolated=*/true,
      [&](int32_t id, TokenVerdict v) {
        ++tokens_walked_;
        if (v == TokenVerdict::kAccepted) entry->accepted[id >> 5] |= 1u << (id & 31);
        if (v == TokenVerdict::kUncertain) uncertain.push_back(id);
      },
      vocab_.sorted_skip());
  // Context expansion. An uncertain token's frame returned after some of its bytes (the path that
  // did not return died); the real stack resumes at one of the rule's return sites.
  const uint32_t rule = g_.RuleOf(pos);
  std::vector<char> fits;
  for (int32_t id : uncertain) {
    const std::string& tok = vocab_.token(id);
    const Sites& sites = SitesOf(rule);
    fits.assign(sites.states.size(), 0);
    uint32_t s = start;
    bool may = false;
    for (size_t d = 0; d < tok.size() && s != StackArena::kDead; ++d) {
      if (arena.IsDone(s) && RestMayFollow(FollowState(rule), tok, d)) {
        may = true;
        for (size_t i = 0; i < fits.size(); ++i)
          if (!fits[i]) fits[i] = RestFits(sites.states[i], tok, d);
      }
      s = arena.Step(s, static_cast<uint8_t>(tok[d]));
    }
    if (!may) continue;  // no site takes the rest: rejected whatever the stack
    bool all = !sites.may_end && !fits.empty() &&
               std::all_of(fits.begin(), fits.end(), [](char f) { return f != 0; });
    if (all) {
      entry->accepted[id >> 5] |= 1u << (id & 31);
    } else {
      entry->uncertain.push_back(id);
    }
  }
  BuildSkipTables(vocab_, entry->uncertain, entry->skip);
  size_t n = 0;
  for (uint32_t w : entry->accepted) n += __builtin_popcount(w);
  if (n < entry->accepted.size()) {
    for (size_t w = 0; w < entry->accepted.size(); ++w) {
      for (uint32_t bits = entry->accepted[w]; bits; bits &= bits - 1)
        entry->accepted_ids.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(bits)));
    }
    entry->accepted.clear();
    entry->accepted.shrink_to_fit();
  }
  return entry;
}

}  // namespace llm::grammar
