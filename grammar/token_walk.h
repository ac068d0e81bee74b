// Runs many tokens through the automaton from one state. Tokens come in byte order, so each
// token resumes from the states its shared prefix with the previous token already computed, and a
// prefix that dies settles every later token that starts with it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/stack.h"
#include "grammar/vocabulary.h"

namespace llm::grammar {

enum class TokenVerdict { kRejected, kAccepted, kUncertain };

// on_verdict(i, verdict) is called for ids[i].
// isolated: `start` came from StackArena::Isolated, and reaching kDone with bytes left makes the
// token uncertain rather than rejected.
//
// skip (optional): skip[d - 1][i] is the first index after i whose token does not share i's first
// d bytes (d <= kSkipDepth, vocabulary.h); a token rejected at depth d then settles all of those at
// once, and they are not reported (callers only collect accepted and uncertain tokens).
template <typename OnVerdict>
void WalkTokens(StackArena& arena, const Vocabulary& vocab, uint32_t start, const int32_t* ids,
                size_t n, bool isolated, OnVerdict&& on_verdict,
                const std::vector<uint32_t>* skip = nullptr) {
  // The whole vocabulary in byte order reads its contiguous copy and shared-prefix lengths.
  const bool whole = ids == vocab.sorted().data();
  auto text = [&](size_t i) -> std::string_view {
    return whole ? vocab.sorted_token(i) : std::string_view(vocab.token(ids[i]));
  };
  std::vector<uint32_t> level(1, start);  // state id after each prefix length
  std::vector<char> returned(1, 0);       // a frame returned to kDone before this depth
  size_t valid = 0;                       // levels 0..valid hold the previous token's prefix
  size_t dead_at = SIZE_MAX;              // the previous token's prefix died at this depth
  TokenVerdict dead_verdict = TokenVerdict::kRejected;
  std::string_view prev;
  size_t prev_i = SIZE_MAX;
  for (size_t i = 0; i < n; ++i) {
    const std::string_view tok = text(i);
    size_t lcp = 0;
    if (prev_i != SIZE_MAX) {
      if (whole && prev_i + 1 == i) {
        lcp = std::min<size_t>(vocab.sorted_lcp(i), valid);
      } else {
        size_t lim = std::min({prev.size(), tok.size(), valid});
        while (lcp < lim && prev[lcp] == tok[lcp]) ++lcp;
      }
    }
    prev = tok;
    prev_i = i;
    if (dead_at != SIZE_MAX && lcp >= dead_at) {
      on_verdict(i, dead_verdict);
      continue;
    }
    dead_at = SIZE_MAX;
    if (level.size() < tok.size() + 1) {
      level.resize(tok.size() + 1);
      returned.resize(tok.size() + 1);
    }
    for (size_t d = lcp; d < tok.size(); ++d) {
      returned[d + 1] = returned[d] || (isolated && arena.IsDone(level[d]));
      level[d + 1] = arena.Step(level[d], static_cast<uint8_t>(tok[d]));
      if (level[d + 1] == StackArena::kDead) {
        dead_at = d + 1;
        break;
      }
    }
    if (dead_at != SIZE_MAX) {
      valid = dead_at;
      dead_verdict = returned[dead_at] ? TokenVerdict::kUncertain : TokenVerdict::kRejected;
      on_verdict(i, dead_verdict);
      if (skip && dead_at <= kSkipDepth && dead_verdict == TokenVerdict::kRejected)
        i = skip[dead_at - 1][i] - 1;
    } else {
      valid = tok.size();
      on_verdict(i, TokenVerdict::kAccepted);
    }
  }
}

}  // namespace llm::grammar
