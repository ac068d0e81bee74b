// Tests for the token sampler: greedy, seeded draws, truncation (top-k, top-p, min-p), the
// empirical distribution, penalties and log-probabilities.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "engine/sampler.h"

namespace llm {
namespace {

std::vector<double> Softmax(const std::vector<float>& logits, double temperature = 1.0) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - max) / temperature);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  std::vector<double> p = Softmax(logits);
  for (double& x : p) x = std::log(x);
  return p;
}

// Draws with a fresh copy of `logits` each time (Sample modifies them in place).
SampledToken Draw(Sampler& s, const std::vector<float>& logits,
                  const std::vector<int32_t>& prompt = {},
                  const std::vector<int32_t>& generated = {}) {
  std::vector<float> copy = logits;
  return s.Sample(copy, prompt, generated);
}

std::vector<double> Frequencies(const SamplingParams& p, const std::vector<float>& logits,
                                int draws) {
  Sampler s(p);
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    const int32_t t = Draw(s, logits).token;
    REQUIRE(t >= 0);
    REQUIRE(t < static_cast<int32_t>(logits.size()));
    f[static_cast<size_t>(t)] += 1.0;
  }
  for (double& x : f) x /= draws;
  return f;
}

const std::vector<float> kLogits = {0.3f, 2.5f, -1.0f, 2.4f, 0.0f, 1.1f, -3.0f, 0.9f};

TEST_CASE("Sampler greedy picks the argmax", "[sampler]") {
  SamplingParams p;
  p.temperature = 0.0f;
  REQUIRE(p.greedy());
  Sampler s(p);
  CHECK(Draw(s, kLogits).token == 1);
  CHECK(Draw(s, {-5.0f, -4.0f, -4.5f}).token == 1);
  CHECK(Draw(s, {7.0f}).token == 0);

  // With logprobs asked for, the chosen token's log-softmax and the top entries are reported.
  p.logprobs = 2;
  Sampler with_logprobs(p);
  const SampledToken t = Draw(with_logprobs, kLogits);
  CHECK(t.token == 1);
  CHECK(t.logprob == Approx(LogSoftmax(kLogits)[1]).margin(1e-5));
  REQUIRE(t.top.size() == 2);
  CHECK(t.top[0].first == 1);
  CHECK(t.top[1].first == 3);
}

TEST_CASE("Sampler top_k=1 at temperature 1 equals the argmax for any seed", "[sampler]") {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 1;
    p.seed = seed;
    Sampler s(p);
    for (int i = 0; i < 5; ++i) REQUIRE(Draw(s, kLogits).token == 1);
  }
}

TEST_CASE("Sampler draws are reproducible per seed", "[sampler]") {
  const std::vector<float> flat(16, 0.0f);
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> seq;
    for (int i = 0; i < 200; ++i) seq.push_back(Draw(s, flat).token);
    return seq;
  };
  const std::vector<int32_t> a1 = run(42), a2 = run(42), b = run(43);
  CHECK(a1 == a2);
  CHECK(a1 != b);
  // The draws actually vary within one stream.
  CHECK(std::set<int32_t>(a1.begin(), a1.end()).size() > 8);
}

TEST_CASE("Sampler with a tiny top_p picks the argmax", "[sampler]") {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams p;
    p.top_p = 1e-6f;
    p.seed = seed;
    Sampler s(p);
    REQUIRE(Draw(s, kLogits).token == 1);
  }
}

TEST_CASE("Sampler top_p keeps the smallest prefix reaching the mass", "[sampler]") {
  // Probabilities 0.5, 0.3, 0.2 (by construction).
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  p.top_p = 0.75f;  // needs the first two tokens
  p.seed = 9;
  const std::vector<double> f = Frequencies(p, logits, 20000);
  CHECK(f[2] == 0.0);
  CHECK(f[0] == Approx(0.5 / 0.8).margin(0.02));
  CHECK(f[1] == Approx(0.3 / 0.8).margin(0.02));
}

TEST_CASE("Sampler with min_p=1 picks the argmax", "[sampler]") {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams p;
    p.min_p = 1.0f;
    p.seed = seed;
    Sampler s(p);
    REQUIRE(Draw(s, kLogits).token == 1);
  }
}

TEST_CASE("Sampler min_p drops tokens below the fraction of the top probability", "[sampler]") {
  // Probabilities proportional to 1, 0.6, 0.3, 0.1.
  const std::vector<float> logits = {0.0f, std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams p;
  p.min_p = 0.5f;
  p.seed = 3;
  const std::vector<double> f = Frequencies(p, logits, 20000);
  CHECK(f[2] == 0.0);
  CHECK(f[3] == 0.0);
  CHECK(f[0] == Approx(1.0 / 1.6).margin(0.02));
  CHECK(f[1] == Approx(0.6 / 1.6).margin(0.02));
}

TEST_CASE("Sampler at temperature 1 matches the softmax distribution", "[sampler]") {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -0.5f};
  SamplingParams p;
  p.seed = 1234;
  const std::vector<double> f = Frequencies(p, logits, 20000);
  const std::vector<double> want = Softmax(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    INFO("token " << i);
    CHECK(f[i] == Approx(want[i]).margin(0.02));
  }
}

TEST_CASE("Sampler truncation path without effective truncation matches the softmax", "[sampler]") {
  // top_k equal to the vocabulary and top_p of 1 truncate nothing, but take the sorted path.
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -0.5f};
  SamplingParams p;
  p.top_k = 4;
  p.seed = 4321;
  const std::vector<double> f = Frequencies(p, logits, 20000);
  const std::vector<double> want = Softmax(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    INFO("token " << i);
    CHECK(f[i] == Approx(want[i]).margin(0.02));
  }
  p.top_k = 0;
  p.top_p = 0.9999f;
  const std::vector<double> g = Frequencies(p, logits, 20000);
  for (size_t i = 0; i < logits.size(); ++i) {
    INFO("token " << i);
    CHECK(g[i] == Approx(want[i]).margin(0.02));
  }
}

TEST_CASE("Sampler temperature 0.5 sharpens the distribution", "[sampler]") {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -0.5f};
  SamplingParams hot, cold;
  hot.seed = cold.seed = 77;
  cold.temperature = 0.5f;
  const std::vector<double> fh = Frequencies(hot, logits, 20000);
  const std::vector<double> fc = Frequencies(cold, logits, 20000);
  const std::vector<double> want = Softmax(logits, 0.5);
  for (size_t i = 0; i < logits.size(); ++i) {
    INFO("token " << i);
    CHECK(fc[i] == Approx(want[i]).margin(0.02));
  }
  CHECK(fc[1] > fh[1] + 0.1);  // the top token gains mass
  CHECK(fc[3] < fh[3]);        // the bottom one loses it
}

TEST_CASE("Sampler top_k=2 never yields a token outside the top 2", "[sampler]") {
  SamplingParams p;
  p.top_k = 2;
  p.temperature = 1.5f;
  p.seed = 5;
  const std::vector<double> f = Frequencies(p, kLogits, 5000);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    if (i != 1 && i != 3) CHECK(f[i] == 0.0);
  }
  // Both top tokens are drawn, near their renormalized probabilities.
  const double e1 = std::exp(2.5 / 1.5), e3 = std::exp(2.4 / 1.5);
  CHECK(f[1] == Approx(e1 / (e1 + e3)).margin(0.03));
  CHECK(f[3] == Approx(e3 / (e1 + e3)).margin(0.03));
}

TEST_CASE("Sampler repetition penalty divides positive and multiplies negative logits",
          "[sampler]") {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> logits = {2.0f, -1.0f, 1.5f, 0.5f};
  const std::vector<int32_t> prompt = {0};
  const std::vector<int32_t> generated = {1, 1};
  const SampledToken t = s.Sample(logits, prompt, generated);
  CHECK(logits[0] == Approx(1.0f));   // seen in the prompt, positive: divided
  CHECK(logits[1] == Approx(-2.0f));  // seen in the output, negative: multiplied (once)
  CHECK(logits[2] == Approx(1.5f));   // unseen: unchanged
  CHECK(logits[3] == Approx(0.5f));
  CHECK(t.token == 2);  // the penalty moved the argmax away from token 0
}

TEST_CASE("Sampler presence and frequency penalties act on generated tokens", "[sampler]") {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<float> logits = {1.0f, 1.0f, 3.0f, 1.0f};
  const std::vector<int32_t> prompt = {3, 3};
  const std::vector<int32_t> generated = {2, 2, 2, 1};
  const SampledToken t = s.Sample(logits, prompt, generated);
  CHECK(logits[0] == Approx(1.0f));
  CHECK(logits[1] == Approx(1.0f - 0.5f - 0.25f));
  CHECK(logits[2] == Approx(3.0f - 0.5f - 0.75f));
  CHECK(logits[3] == Approx(1.0f));  // prompt tokens are not penalized
  CHECK(t.token == 2);

  SamplingParams strong = p;
  strong.frequency_penalty = 1.0f;
  Sampler s2(strong);
  std::vector<float> logits2 = {1.0f, 1.0f, 3.0f, 1.0f};
  CHECK(s2.Sample(logits2, prompt, generated).token == 0);  // 3 - 0.5 - 3 < 1
}

TEST_CASE("ComputeLogprobs matches log_softmax and sorts the top entries", "[sampler]") {
  const int vocab = static_cast<int>(kLogits.size());
  const std::vector<double> want = LogSoftmax(kLogits);
  for (int32_t token = 0; token < vocab; ++token) {
    SampledToken out;
    ComputeLogprobs(kLogits, token, 3, &out);
    CHECK(out.logprob == Approx(want[static_cast<size_t>(token)]).margin(1e-5));
    REQUIRE(out.top.size() == 3);
    CHECK(out.top[0].first == 1);
    CHECK(out.top[1].first == 3);
    CHECK(out.top[2].first == 5);
    for (const auto& [id, lp] : out.top) {
      CHECK(lp == Approx(want[static_cast<size_t>(id)]).margin(1e-5));
    }
  }

  SampledToken all;
  ComputeLogprobs(kLogits, 0, vocab + 10, &all);  // n past the vocabulary is clamped
  REQUIRE(static_cast<int>(all.top.size()) == vocab);
  double mass = 0.0;
  for (size_t i = 0; i < all.top.size(); ++i) {
    if (i > 0) CHECK(all.top[i - 1].second >= all.top[i].second);
    mass += std::exp(static_cast<double>(all.top[i].second));
  }
  CHECK(mass == Approx(1.0).margin(1e-5));
  std::vector<int32_t> ids;
  for (const auto& e : all.top) ids.push_back(e.first);
  std::sort(ids.begin(), ids.end());
  std::vector<int32_t> expect_ids(static_cast<size_t>(vocab));
  std::iota(expect_ids.begin(), expect_ids.end(), 0);
  CHECK(ids == expect_ids);

  SampledToken none;
  none.top.emplace_back(9, 9.0f);
  ComputeLogprobs(kLogits, 2, 0, &none);
  CHECK(none.top.empty());
  CHECK(none.logprob == Approx(want[2]).margin(1e-5));
}

TEST_CASE("Sampler reports logprobs of the raw logits, before temperature", "[sampler]") {
  SamplingParams p;
  p.temperature = 0.5f;
  p.logprobs = 2;
  p.seed = 11;
  Sampler s(p);
  const std::vector<double> want = LogSoftmax(kLogits);
  for (int i = 0; i < 20; ++i) {
    const SampledToken t = Draw(s, kLogits);
    REQUIRE(t.token >= 0);
    CHECK(t.logprob == Approx(want[static_cast<size_t>(t.token)]).margin(1e-5));
    REQUIRE(t.top.size() == 2);
    CHECK(t.top[0].first == 1);
    CHECK(t.top[0].second == Approx(want[1]).margin(1e-5));
    CHECK(t.top[1].first == 3);
  }
}

TEST_CASE("Sampler large logits stay finite", "[sampler]") {
  const std::vector<float> logits = {1000.0f, 999.0f, -1000.0f};
  SamplingParams p;
  p.seed = 2;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) {
    const SampledToken t = Draw(s, logits);
    CHECK(t.token != 2);
    CHECK(std::isfinite(t.logprob));
  }
}

}  // namespace
}  // namespace llm
