// The per-position token cache: for a stack top at position p, seen without what lies below it,
// which tokens are accepted whatever the stack holds, which are rejected whatever it holds, and
// which are uncertain (the frame returns mid-token, so the rest depends on the caller).
//
// Context expansion: when p's rule returns mid-token, the rest of the token must fit what can
// follow that rule somewhere in the grammar (its return sites: the position after every call of
// the rule, through tail calls). A token whose rest fits none of them is rejected at build time,
// and one whose rest fits every one of them (and the rule never ends the output) is accepted. Only
// tokens that fit some return sites but not others (such as ` "` after whitespace, fine before a
// key but not before a colon) stay uncertain and are walked against the real stack when a mask is
// filled.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/stack.h"
#include "grammar/vocabulary.h"

namespace llm::grammar {

struct TokenCacheEntry {
  // The accepted tokens: a bitmask over token ids, or, when fewer tokens than the bitmask has
  // words, their ids (most positions accept few tokens: one byte's continuations).
  std::vector<uint32_t> accepted;
  std::vector<int32_t> accepted_ids;
  // ORs the accepted tokens into `mask`.
  void AddAccepted(uint32_t* mask) const {
    for (size_t w = 0; w < accepted.size(); ++w) mask[w] |= accepted[w];
    for (int32_t id : accepted_ids) mask[id >> 5] |= 1u << (id & 31);
  }
  std::vector<int32_t> uncertain;  // token ids in byte order
  // The rule's return sites (sorted positions) and, for each site, a verdict per uncertain token
  // when the real stack resumes there: site_verdicts[site * uncertain.size() + i]. kWalk: the
  // site's own rule returns within the token too, so the token is walked against the real stack.
  // Empty when the rule has too many sites: every uncertain token is walked.
  enum : uint8_t { kReject = 0, kAccept = 1, kWalk = 2 };
  std::vector<uint32_t> sites;
  std::vector<uint8_t> site_verdicts;
  // Skip tables of the uncertain list for its walks (token_walk.h).
  std::vector<uint32_t> skip[kSkipDepth];
};

// Builds entries for one grammar and vocabulary. Entries of different positions share one arena,
// so the automaton's memoized transitions are computed once for all of them. Not thread-safe: one
// builder per thread.
class TokenCacheBuilder {
 public:
  TokenCacheBuilder(const Grammar& g, const Vocabulary& vocab);
  std::unique_ptr<TokenCacheEntry> Build(uint32_t pos);
  // Tokens the walks of all Build calls so far reached past their first byte: the work done.
  uint64_t tokens_walked() const { return tokens_walked_; }

  // Positions where control resumes after `rule` returns, over every call of it (tail calls pass
  // their caller's return sites on). The root's return ends the output: it adds no site and sets
  // *may_end.
  std::vector<uint32_t> ReturnSites(uint32_t rule, bool* may_end) const;

 private:
  // The state of every return site of `rule`, each isolated (its own return is kDone).
  uint32_t FollowState(uint32_t rule);
  // tok[from..] may be the start of what follows the rule (or reaches past that too).
  bool RestMayFollow(uint32_t follow, std::string_view tok, size_t from);
  // tok[from..] once the real stack resumes at return site q: kAccept (consumed whatever lies
  // below), kReject (it cannot be) or kWalk (it depends on what lies below). When q's rule
  // returns within it, the verdict of every one of that rule's sites decides, `depth` more levels.
  uint8_t RestAtSite(uint32_t q, std::string_view tok, size_t from, int depth);
  uint8_t RestAtEverySite(uint32_t rule, std::string_view tok, size_t from, int depth);
  uint32_t SiteState(uint32_t q);  // q isolated
  struct Sites {
    std::vector<uint32_t> positions;  // ReturnSites; empty when over the limit
    bool over_limit = false;
    bool may_end = false;
  };
  const Sites& SitesOf(uint32_t rule);

  const Grammar& g_;
  const Vocabulary& vocab_;
  uint64_t tokens_walked_ = 0;
  std::unique_ptr<StackArena> arena_;
  std::vector<std::vector<uint32_t>> call_sites_;    // per rule: q + 1 for each non-tail call at q
  std::vector<std::vector<uint32_t>> tail_callers_;  // per rule: rules that tail-call it
  std::vector<uint32_t> follow_state_;               // per rule; kUnset until first needed
  std::vector<std::unique_ptr<Sites>> sites_;
  std::unordered_map<uint32_t, uint32_t> site_state_;  // per rule; null until first needed
};

}  // namespace llm::grammar
