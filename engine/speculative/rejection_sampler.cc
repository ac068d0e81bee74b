#include "engine/speculative/rejection_sampler.h"

#include <algorithm>

#include "base/check.h"

namespace llm {

double TokenProbs::at(int32_t id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  return it != ids.end() && *it == id ? probs[static_cast<size_t>(it - ids.begin())] : 0.0;
}

TokenProbs ToTokenProbs(const KeptDistribution& d) {
  TokenProbs p;
  p.ids = d.ids;
  p.probs.resize(d.ids.size());
  const double total = static_cast<double>(d.total);
  for (size_t i = 0; i < d.ids.size(); ++i) p.probs[i] = static_cast<double>(d.masses[i]) / total;
  return p;
}

TokenProbs OneHot(int32_t token) {
  return TokenProbs{{token}, {1.0}};
}

bool AcceptDraft(const TokenProbs& p, const TokenProbs& q, int32_t x, double u) {
  const double qx = q.at(x);
  LLM_CHECK(qx > 0.0) << "draft token " << x << " has no probability under its proposal";
  // u < min(1, p / q), written without the division.
  return u * qx < p.at(x);
}

namespace {

// Inverse CDF over `ids` (ascending) with weights w; `u` in [0, 1).
int32_t Draw(const std::vector<int32_t>& ids, const std::vector<double>& w, double u) {
  double total = 0.0;
  for (double x : w) total += x;
  const double threshold = u * total;
  double cum = 0.0;
  int32_t last = ids.front();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (w[i] <= 0.0) continue;
    cum += w[i];
    last = ids[i];
    if (cum > threshold) return ids[i];
  }
  return last;  // rounding left threshold at the total: the last id with weight
}

}  // namespace

int32_t SampleFrom(const TokenProbs& p, double u) {
  LLM_CHECK(!p.ids.empty()) << "an empty distribution";
  return Draw(p.ids, p.probs, u);
}

int32_t SampleRecovered(const TokenProbs& p, const TokenProbs& q, double u) {
  std::vector<double> residual(p.ids.size());
  bool any = false;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    residual[i] = std::max(p.probs[i] - q.at(p.ids[i]), 0.0);
    any = any || residual[i] > 0.0;
  }
  return any ? Draw(p.ids, residual, u) : SampleFrom(p, u);
}

VerifyResult VerifyGreedy(std::span<const int32_t> draft,
                          const std::function<int32_t(int)>& target_argmax) {
  VerifyResult r;
  for (size_t j = 0; j <= draft.size(); ++j) {
    const int32_t t = target_argmax(static_cast<int>(j));
    if (j < draft.size() && draft[j] == t) {
      r.tokens.push_back(t);
      ++r.num_accepted;
      continue;
    }
    r.tokens.push_back(t);  // the correction at the first mismatch, or the bonus token
    break;
  }
  return r;
}

VerifyResult VerifySampled(std::span<const int32_t> draft,
                           const std::function<TokenProbs(int)>& target,
                           const std::function<TokenProbs(int)>& draft_probs,
                           const std::function<double()>& uniform) {
  VerifyResult r;
  for (size_t j = 0; j < draft.size(); ++j) {
    const TokenProbs p = target(static_cast<int>(j));
    const TokenProbs q = draft_probs ? draft_probs(static_cast<int>(j)) : OneHot(draft[j]);
    if (AcceptDraft(p, q, draft[j], uniform())) {
      r.tokens.push_back(draft[j]);
      ++r.num_accepted;
      continue;
    }
    r.tokens.push_back(SampleRecovered(p, q, uniform()));
    return r;
  }
  r.tokens.push_back(SampleFrom(target(static_cast<int>(draft.size())), uniform()));  // bonus
  return r;
}

VerifyResult VerifyByTargetDraws(std::span<const int32_t> draft,
                                 const std::function<int32_t(int)>& target_draw) {
  return VerifyGreedy(draft, target_draw);  // the same comparison; the rows drew the tokens
}

}  // namespace llm
