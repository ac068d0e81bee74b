#include "grammar/token_cache.h"

#include <algorithm>

#include "grammar/token_walk.h"

namespace llm::grammar {

namespace {
constexpr uint32_t kUnset = UINT32_MAX;
// A shared arena keeps every state it met with 1 KiB of transitions each; past this many states a
// builder starts a fresh one, which bounds its memory on large grammars.
constexpr size_t kMaxArenaStates = 1 << 15;
// Rules returning to more sites than this keep their tokens that fit some sites uncertain without
// per-site verdicts, rather than walking each token against every site.
constexpr size_t kMaxSitesChecked = 256;
// How many rule returns past the first a verdict follows through return sites before it leaves the
// token to a walk against the real stack.
constexpr int kSiteDepth = 2;
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

bool TokenCacheBuilder::RestMayFollow(uint32_t follow, std::string_view tok, size_t from) {
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
    s->positions = ReturnSites(rule, &s->may_end);
    if (s->positions.size() > kMaxSitesChecked) {
      s->positions.clear();
      s->over_limit = true;
    }
    sites_[rule] = std::move(s);
  }
  return *sites_[rule];
}

uint32_t TokenCacheBuilder::SiteState(uint32_t q) {
  auto [it, inserted] = site_state_.try_emplace(q, 0);
  if (inserted) it->second = arena_->InternState(arena_->Isolated(q));
  return it->second;
}

uint8_t TokenCacheBuilder::RestAtSite(uint32_t q, std::string_view tok, size_t from, int depth) {
  uint32_t s = SiteState(q);
  uint8_t verdict = TokenCacheEntry::kReject;
  for (size_t d = from; d < tok.size(); ++d) {
    if (arena_->IsDone(s)) {
      // The site's own rule returned before byte d: what follows is one of its return sites.
      verdict = std::max(verdict, depth > 0 ? RestAtEverySite(g_.RuleOf(q), tok, d, depth - 1)
                                            : uint8_t{TokenCacheEntry::kWalk});
      if (verdict == TokenCacheEntry::kAccept) return verdict;
    }
    s = arena_->Step(s, static_cast<uint8_t>(tok[d]));
    if (s == StackArena::kDead) return verdict;
  }
  return TokenCacheEntry::kAccept;
}

uint8_t TokenCacheBuilder::RestAtEverySite(uint32_t rule, std::string_view tok, size_t from,
                                           int depth) {
  const Sites& sites = SitesOf(rule);
  if (sites.over_limit) return TokenCacheEntry::kWalk;
  bool all_accept = !sites.may_end && !sites.positions.empty(), all_reject = true;
  for (uint32_t q : sites.positions) {
    uint8_t v = RestAtSite(q, tok, from, depth);
    all_accept = all_accept && v == TokenCacheEntry::kAccept;
    all_reject = all_reject && v == TokenCacheEntry::kReject;
    if (!all_accept && !all_reject) return TokenCacheEntry::kWalk;
  }
  return all_accept   ? TokenCacheEntry::kAccept
         : all_reject ? TokenCacheEntry::kReject
                      : TokenCacheEntry::kWalk;
}

std::unique_ptr<TokenCacheEntry> TokenCacheBuilder::Build(uint32_t pos) {
  if (arena_->num_states() > kMaxArenaStates) {
    arena_ = std::make_unique<StackArena>(&g_);
    follow_state_.assign(g_.num_rules(), kUnset);
    site_state_.clear();
  }
  auto entry = std::make_unique<TokenCacheEntry>();
  entry->accepted.assign(vocab_.mask_words(), 0);
  StackArena& arena = *arena_;
  const uint32_t start = arena.InternState(arena.Isolated(pos));
  const auto& ids = vocab_.sorted();
  std::vector<uint32_t> uncertain;  // indices into ids
  WalkTokens(
      arena, vocab_, start, ids.data(), ids.size(), /*isolated=*/true,
      [&](size_t i, TokenVerdict v) {
        ++tokens_walked_;
        if (v == TokenVerdict::kAccepted) entry->accepted[ids[i] >> 5] |= 1u << (ids[i] & 31);
        if (v == TokenVerdict::kUncertain) uncertain.push_back(static_cast<uint32_t>(i));
      },
      vocab_.sorted_skip());
  // Context expansion. An uncertain token's frame returned after some of its bytes (the path that
  // did not return died); the real stack resumes at one of the rule's return sites.
  const uint32_t rule = g_.RuleOf(pos);
  const Sites& sites = SitesOf(rule);
  const size_t num_sites = sites.positions.size();
  std::vector<uint8_t> row;
  std::vector<uint8_t> rows;  // per uncertain token kept: its verdict at each site
  for (uint32_t index : uncertain) {
    const int32_t id = ids[index];
    const std::string_view tok = vocab_.sorted_token(index);
    row.assign(num_sites, TokenCacheEntry::kReject);
    uint32_t s = start;
    bool may = false;
    for (size_t d = 0; d < tok.size() && s != StackArena::kDead; ++d) {
      if (arena.IsDone(s) && RestMayFollow(FollowState(rule), tok, d)) {
        may = true;
        for (size_t i = 0; i < num_sites; ++i) {
          if (row[i] != TokenCacheEntry::kAccept) {
            uint8_t v = RestAtSite(sites.positions[i], tok, d, kSiteDepth);
            if (v != TokenCacheEntry::kReject) row[i] = v;
          }
        }
      }
      s = arena.Step(s, static_cast<uint8_t>(tok[d]));
    }
    if (!may) continue;  // no site takes the rest: rejected whatever the stack
    auto all = [&](uint8_t v) {
      return num_sites > 0 &&
             std::all_of(row.begin(), row.end(), [v](uint8_t x) { return x == v; });
    };
    if (all(TokenCacheEntry::kReject)) continue;
    if (!sites.may_end && all(TokenCacheEntry::kAccept)) {
      entry->accepted[id >> 5] |= 1u << (id & 31);
      continue;
    }
    entry->uncertain.push_back(id);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  // Site-major, so a fill reads one site's verdicts in a row.
  if (num_sites > 0 && !entry->uncertain.empty()) {
    entry->sites = sites.positions;
    const size_t n = entry->uncertain.size();
    entry->site_verdicts.resize(num_sites * n);
    for (size_t t = 0; t < n; ++t)
      for (size_t i = 0; i < num_sites; ++i)
        entry->site_verdicts[i * n + t] = rows[t * num_sites + i];
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
