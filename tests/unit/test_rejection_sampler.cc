// The acceptance rule of speculative decoding (engine/speculative/rejection_sampler.h): greedy
// verification, and rejection sampling that keeps the target distribution. The distribution tests
// draw many tokens with fixed seeds and compare frequencies by chi-square, and show that broken
// rules (accept every draft; resample from p instead of the residual) fail the same test.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <vector>

#include "engine/sampling/sampler.h"
#include "engine/speculative/rejection_sampler.h"

namespace llm {
namespace {

// chi-square critical values at p = 0.001 by degrees of freedom.
double ChiSquareCritical(int df) {
  static const double kTable[] = {0,      10.828, 13.816, 16.266, 18.467, 20.515,
                                  22.458, 24.322, 26.124, 27.877, 29.588};
  REQUIRE(df >= 1);
  REQUIRE(df <= 10);
  return kTable[df];
}

// Goodness of fit of `counts` (token -> count) to p; tokens outside p count as impossible.
bool FitsDistribution(const std::map<int32_t, int>& counts, const TokenProbs& p, int n) {
  for (const auto& [t, c] : counts) {
    if (p.at(t) == 0.0 && c > 0) return false;
  }
  double chi2 = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double expected = p.probs[i] * n;
    const auto it = counts.find(p.ids[i]);
    const double observed = it == counts.end() ? 0 : it->second;
    chi2 += (observed - expected) * (observed - expected) / expected;
  }
  return chi2 < ChiSquareCritical(static_cast<int>(p.ids.size()) - 1);
}

// Two samples from the same distribution? (chi-square test of homogeneity.)
bool SameDistribution(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::map<int32_t, std::pair<int, int>> cells;
  int na = 0, nb = 0;
  for (const auto& [t, c] : a) cells[t].first += c, na += c;
  for (const auto& [t, c] : b) cells[t].second += c, nb += c;
  double chi2 = 0;
  for (const auto& [t, ab] : cells) {
    const double total = ab.first + ab.second;
    const double ea = total * na / (na + nb), eb = total * nb / (na + nb);
    chi2 += (ab.first - ea) * (ab.first - ea) / ea + (ab.second - eb) * (ab.second - eb) / eb;
  }
  return chi2 < ChiSquareCritical(static_cast<int>(cells.size()) - 1);
}

TokenProbs Probs(std::vector<double> p) {
  TokenProbs d;
  for (size_t i = 0; i < p.size(); ++i) {
    d.ids.push_back(static_cast<int32_t>(i));
    d.probs.push_back(p[i]);
  }
  return d;
}

using Verifier =
    std::function<VerifyResult(std::span<const int32_t>, const std::function<TokenProbs(int)>&,
                               const std::function<double()>&)>;

VerifyResult Correct(std::span<const int32_t> draft, const std::function<TokenProbs(int)>& target,
                     const std::function<double()>& uniform) {
  return VerifySampled(draft, target, nullptr, uniform);
}

// Broken: every draft is accepted.
VerifyResult AlwaysAccept(std::span<const int32_t> draft, const std::function<TokenProbs(int)>& t,
                          const std::function<double()>& uniform) {
  VerifyResult r;
  r.tokens.assign(draft.begin(), draft.end());
  r.num_accepted = static_cast<int>(draft.size());
  r.tokens.push_back(SampleFrom(t(static_cast<int>(draft.size())), uniform()));
  return r;
}

// Broken: accepted with probability p(x), but a rejection resamples from p (x included).
VerifyResult ResampleFromP(std::span<const int32_t> draft, const std::function<TokenProbs(int)>& t,
                           const std::function<double()>& uniform) {
  VerifyResult r;
  for (size_t j = 0; j <= draft.size(); ++j) {
    const TokenProbs p = t(static_cast<int>(j));
    if (j < draft.size() && AcceptDraft(p, OneHot(draft[j]), draft[j], uniform())) {
      r.tokens.push_back(draft[j]);
      ++r.num_accepted;
      continue;
    }
    r.tokens.push_back(SampleFrom(p, uniform()));
    break;
  }
  return r;
}

// The first token and the second given that the first draft was accepted, over many trials of a
// two-token n-gram draft: they must follow p0 and p1.
bool KeepsTargetDistribution(const Verifier& verify, uint64_t seed) {
  const TokenProbs p0 = Probs({0.3, 0.25, 0.2, 0.15, 0.1});
  const TokenProbs p1 = Probs({0.05, 0.15, 0.4, 0.3, 0.1});
  const std::vector<int32_t> draft = {0, 3};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::map<int32_t, int> first, second;
  int n_second = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const VerifyResult r = verify(
        draft, [&](int j) { return j == 0 ? p0 : p1; }, [&] { return uni(rng); });
    REQUIRE(r.tokens.size() == static_cast<size_t>(r.num_accepted) + 1);
    first[r.tokens[0]]++;
    if (r.num_accepted >= 1) {  // the first draft accepted: a second token follows
      second[r.tokens[1]]++;
      ++n_second;
    }
  }
  return FitsDistribution(first, p0, n) && FitsDistribution(second, p1, n_second);
}

TEST_CASE("greedy verification accepts drafts while they equal the argmax",
          "[speculative][rejection_sampler]") {
  const std::vector<int32_t> target = {4, 7, 2, 9, 5};  // argmax after each prefix
  auto argmax = [&](int j) { return target[static_cast<size_t>(j)]; };
  VerifyResult r = VerifyGreedy(std::vector<int32_t>{4, 7, 2, 9}, argmax);
  CHECK(r.num_accepted == 4);
  CHECK(r.tokens == std::vector<int32_t>{4, 7, 2, 9, 5});  // all accepted: the bonus token
  r = VerifyGreedy(std::vector<int32_t>{4, 7, 3, 9}, argmax);
  CHECK(r.num_accepted == 2);
  CHECK(r.tokens == std::vector<int32_t>{4, 7, 2});  // the target's token at the first mismatch
  r = VerifyGreedy(std::vector<int32_t>{1}, argmax);
  CHECK(r.num_accepted == 0);
  CHECK(r.tokens == std::vector<int32_t>{4});
}

TEST_CASE("rejection sampling primitives", "[speculative][rejection_sampler]") {
  const TokenProbs p = Probs({0.5, 0.3, 0.2});
  const TokenProbs x1 = OneHot(1);
  CHECK(AcceptDraft(p, x1, 1, 0.29));
  CHECK_FALSE(AcceptDraft(p, x1, 1, 0.3));
  // q(x) below p(x): always accepted.
  const TokenProbs q = Probs({0.2, 0.1, 0.7});
  CHECK(AcceptDraft(p, q, 1, 0.999));
  CHECK(AcceptDraft(p, q, 2, 0.2857));  // 0.2 / 0.7 = 0.2857...
  CHECK_FALSE(AcceptDraft(p, q, 2, 0.2858));
  // After a one-hot rejection the residual never holds the rejected token.
  for (double u : {0.0, 0.3, 0.5, 0.71, 0.999}) CHECK(SampleRecovered(p, x1, u) != 1);
  CHECK(SampleRecovered(p, x1, 0.0) == 0);
  CHECK(SampleRecovered(p, x1, 0.999) == 2);
  // Residual max(p - q, 0) = {0.3, 0.2, 0}: never token 2.
  for (double u : {0.0, 0.59, 0.61, 0.999}) CHECK(SampleRecovered(p, q, u) != 2);
  CHECK(SampleFrom(p, 0.49) == 0);
  CHECK(SampleFrom(p, 0.51) == 1);
  CHECK(SampleFrom(p, 0.81) == 2);
  CHECK(p.at(7) == 0.0);
}

TEST_CASE("rejection sampling keeps the target distribution and broken rules do not",
          "[speculative][rejection_sampler]") {
  CHECK(KeepsTargetDistribution(Correct, 1));
  CHECK(KeepsTargetDistribution(Correct, 2));
  CHECK_FALSE(KeepsTargetDistribution(AlwaysAccept, 1));
  CHECK_FALSE(KeepsTargetDistribution(ResampleFromP, 1));
}

TEST_CASE("rejection sampling with a draft distribution q keeps the target distribution",
          "[speculative][rejection_sampler]") {
  const TokenProbs p = Probs({0.1, 0.2, 0.3, 0.25, 0.15});
  const TokenProbs q = Probs({0.4, 0.05, 0.05, 0.2, 0.3});  // far from p
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::map<int32_t, int> correct, no_residual;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t> draft = {SampleFrom(q, uni(rng))};
    const VerifyResult r = VerifySampled(
        draft, [&](int) { return p; }, [&](int) { return q; }, [&] { return uni(rng); });
    correct[r.tokens[0]]++;
    // Broken: a rejection draws from p itself.
    no_residual[AcceptDraft(p, q, draft[0], uni(rng)) ? draft[0] : SampleFrom(p, uni(rng))]++;
  }
  CHECK(FitsDistribution(correct, p, n));
  CHECK_FALSE(FitsDistribution(no_residual, p, n));
}

// The sampler's own distribution (temperature, top-k, top-p, penalties, logit bias as penalty
// entries): tokens drawn one per step by SampleWithJob and tokens drawn by verifying n-gram drafts
// against the same processed distribution are the same distribution; an always-accept rule is not.
TEST_CASE("speculative sampling matches the sampler's distribution",
          "[speculative][rejection_sampler]") {
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.9f, 2.2f};
  SamplingJob job;
  job.temperature = 0.8f;
  job.top_k = 6;
  job.top_p = 0.95f;
  job.repetition_penalty = 1.2f;
  job.presence_penalty = 0.3f;
  const std::vector<PenaltyEntry> penalties = {{1, 2, 0.0f}, {5, 0, 0.5f}, {6, -1, 1.0f}};
  auto target = [&](int) {
    std::vector<float> l = logits;
    return ToTokenProbs(SamplingDistribution(l, job, penalties));
  };
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::map<int32_t, int> plain, speculative, broken;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    SamplingJob j = job;
    j.u = uni(rng);
    plain[SampleWithJob(l, j, penalties).token]++;
    const std::vector<int32_t> draft = {7};  // a draft the target finds plausible
    speculative[Correct(draft, target, [&] { return uni(rng); }).tokens[0]]++;
    broken[AlwaysAccept(draft, target, [&] { return uni(rng); }).tokens[0]]++;
  }
  CHECK(speculative.size() > 3);
  CHECK(SameDistribution(plain, speculative));
  CHECK_FALSE(SameDistribution(plain, broken));
}

}  // namespace
}  // namespace llm
