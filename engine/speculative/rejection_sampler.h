// Verification of draft tokens against the target model (speculative decoding's acceptance rule).
// Greedy: a draft is accepted while it equals the target's argmax; the first mismatch is replaced
// by the argmax (or, all accepted, the argmax after the last draft is the bonus token), so the
// output is the target's greedy output. Sampled: rejection sampling (Leviathan et al. 2023, Chen
// et al. 2023): draft x drawn from q is accepted with probability min(1, p(x) / q(x)); at the
// first rejection the token is drawn from max(p - q, 0) normalised; all accepted, the bonus token
// is drawn from p after the last draft. Every emitted token is then distributed as the target's p
// whatever q is. n-gram drafts are a one-hot q (accept x with probability p(x), resample from p
// without x); a draft model passes its own q.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/sampling/sampler.h"

namespace llm {

// A distribution over token ids: ids ascending, probabilities summing to 1 (up to rounding).
struct TokenProbs {
  std::vector<int32_t> ids;
  std::vector<double> probs;
  double at(int32_t id) const;  // 0 for an id not listed
};

// The sampler's kept set, normalised.
TokenProbs ToTokenProbs(const KeptDistribution& d);
TokenProbs OneHot(int32_t token);

// Whether draft token x, proposed with probability q(x) > 0, is accepted under the target p;
// `u` is a uniform draw in [0, 1): accepted iff u < p(x) / q(x).
bool AcceptDraft(const TokenProbs& p, const TokenProbs& q, int32_t x, double u);
// The token after a rejection: drawn with `u` from max(p - q, 0) normalised. When that has no
// mass (p <= q everywhere, only possible up to rounding after a rejection), from p.
int32_t SampleRecovered(const TokenProbs& p, const TokenProbs& q, double u);
// A draw from p with `u` (inverse CDF over ascending ids).
int32_t SampleFrom(const TokenProbs& p, double u);

struct VerifyResult {
  int num_accepted = 0;         // leading drafts accepted
  std::vector<int32_t> tokens;  // the accepted drafts, then one token of the target's
};

// Greedy verification: target_argmax(j) is the target's token after the context and draft[0..j)
// (j = 0 .. draft.size(); only the positions needed are asked, in order).
VerifyResult VerifyGreedy(std::span<const int32_t> draft,
                          const std::function<int32_t(int)>& target_argmax);

// One-hot drafts (n-gram, greedy drafts) verified from the target's own draws: target_draw(j) is
// a token drawn from p_j (its argmax when greedy), asked in order. Accepting while the draw equals
// the draft is VerifySampled's rule for a one-hot q: draft x is accepted with probability p(x),
// and the draw that differs is distributed as p without x, normalised (max(p - q, 0) normalised);
// all accepted, the last draw is the bonus token.
VerifyResult VerifyByTargetDraws(std::span<const int32_t> draft,
                                 const std::function<int32_t(int)>& target_draw);

// Sampled verification: target(j) is the target's processed distribution p_j after draft[0..j)
// (j = 0 .. draft.size(), asked in order, each at most once); draft_probs(j) the distribution
// draft[j] was drawn from (an empty function: one-hot, the n-gram case); uniform() a draw in
// [0, 1), one per acceptance test and one for the final token.
VerifyResult VerifySampled(std::span<const int32_t> draft,
                           const std::function<TokenProbs(int)>& target,
                           const std::function<TokenProbs(int)>& draft_probs,
                           const std::function<double()>& uniform);

}  // namespace llm
