// Tests for the token sampler: greedy, seeded draws, truncation (top-k, top-p, min-p), the
// empirical distribution, penalties and log-probabilities; the shared host/device definition
// (id-ordered draw, integer masses, the exp both sides compute) and the device-job split.
#include <catch2/catch.hpp>

#include <limits>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/sampling/sampler.h"

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

TEST_CASE("Argmax equals std::max_element on ties, NaNs, infinities and odd lengths", "[sampler]") {
  std::mt19937 rng(5);
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 70);
    std::vector<float> x(n);
    // Few distinct values, so ties are common; sprinkle NaN and +-inf.
    for (float& v : x) {
      const unsigned r = rng() % 20;
      v = r == 0 ? kNaN : r == 1 ? kInf : r == 2 ? -kInf : static_cast<float>(rng() % 5) - 2.0f;
    }
    const auto expect = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
    INFO("trial " << trial << " n " << n);
    REQUIRE(Argmax(x) == expect);
  }
}

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

// A job at temperature 1 with the given truncation and draw.
SamplingJob Job(double u, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingJob j;
  j.temperature = 1.0f;
  j.top_k = top_k;
  j.top_p = top_p;
  j.min_p = min_p;
  j.u = u;
  return j;
}

int32_t DrawJob(const std::vector<float>& logits, const SamplingJob& job,
                const std::vector<PenaltyEntry>& penalties = {}) {
  std::vector<float> copy = logits;
  return SampleWithJob(copy, job, penalties).token;
}

TEST_CASE("Sampler draw walks the kept ids in ascending id order", "[sampler]") {
  // p proportional to 1, 2, 4, 1: sorted order 2, 1, 0, 3. With u = 0.2 the id-ordered walk
  // crosses 0.2 * 8 = 1.6 at id 1 (cumulative 1, 3); the old sorted walk crossed it at id 2.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(4.0f), 0.0f};
  CHECK(DrawJob(logits, Job(0.2)) == 1);
  CHECK(DrawJob(logits, Job(0.1)) == 0);
  CHECK(DrawJob(logits, Job(0.99)) == 3);
  // top_k = 4 truncates nothing but takes the sorted path: same id-ordered walk.
  CHECK(DrawJob(logits, Job(0.2, 4)) == 1);
  // top_k = 3: ids 0 and 3 tie at the cut, the lower id is kept. K = {0, 1, 2}, mass 7.
  CHECK(DrawJob(logits, Job(0.2, 3)) == 1);
  CHECK(DrawJob(logits, Job(0.99, 3)) == 2);
  CHECK(DrawJob(logits, Job(0.0, 3)) == 0);
}

TEST_CASE("Sampler top_p keeps ties at the cut in ascending id order", "[sampler]") {
  // Four tokens tie at the top (p = 1 each), one below. top_p = 0.5 needs ceil(0.5 * 4.37) =
  // 2.19 units: the prefix is the first three ties by id, so id 4 is never drawn.
  const std::vector<float> logits = {2.0f, 1.0f, 2.0f, 2.0f, 2.0f};
  std::map<int32_t, int> seen;
  for (int i = 0; i < 300; ++i) ++seen[DrawJob(logits, Job((i + 0.5) / 300.0, 0, 0.5f))];
  CHECK(seen.size() == 3);
  CHECK(seen[0] == 100);
  CHECK(seen[2] == 100);
  CHECK(seen[3] == 100);
  // top_k = 2 on the same ties: ids 0 and 2.
  seen.clear();
  for (int i = 0; i < 100; ++i) ++seen[DrawJob(logits, Job((i + 0.5) / 100.0, 2))];
  CHECK(seen.size() == 2);
  CHECK(seen[0] == 50);
  CHECK(seen[2] == 50);
}

TEST_CASE("Sampler stratified draws reproduce the kept distribution exactly", "[sampler]") {
  // With u = (i + 0.5) / n, each kept token is drawn round(n * q_i / sum q) times, up to one.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(300);
  for (float& x : logits) x = nd(rng);
  for (const SamplingJob& base : {Job(0), Job(0, 20), Job(0, 0, 0.8f), Job(0, 50, 0.9f, 0.05f)}) {
    // The kept set and masses from the definition, computed here independently of the sampler.
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const float max = logits[order[0]];
    auto mass = [&](int32_t i) { return sampling::Mass(sampling::Prob(logits[i], max, 1.0f)); };
    size_t keep = base.top_k > 0 ? static_cast<size_t>(base.top_k) : order.size();
    if (base.top_p < 1.0f) {
      uint64_t total = 0, cum = 0;
      for (size_t i = 0; i < keep; ++i) total += mass(order[i]);
      size_t n = 0;
      while (n < keep && cum < sampling::TopPTarget(base.top_p, total)) cum += mass(order[n++]);
      keep = n;
    }
    order.resize(keep);
    std::erase_if(order, [&](int32_t i) {
      return base.min_p > 0 && sampling::Prob(logits[i], max, 1.0f) < base.min_p;
    });
    keep = order.size();
    uint64_t total = 0;
    for (size_t i = 0; i < keep; ++i) total += mass(order[i]);
    const int n = 20000;
    std::map<int32_t, int> seen;
    for (int i = 0; i < n; ++i) {
      SamplingJob job = base;
      job.u = (i + 0.5) / n;
      ++seen[DrawJob(logits, job)];
    }
    INFO("top_k " << base.top_k << " top_p " << base.top_p << " min_p " << base.min_p);
    CHECK(seen.size() <= keep);
    for (const auto& [id, count] : seen) {
      const auto pos = std::find(order.begin(), order.end(), id) - order.begin();
      REQUIRE(static_cast<size_t>(pos) < keep);
      const double want = static_cast<double>(mass(id)) / static_cast<double>(total) * n;
      CHECK(std::fabs(count - want) <= 1.0);
    }
  }
}

TEST_CASE("Sampler shared exp matches std::exp and gives the top token mass 2^34", "[sampler]") {
  CHECK(sampling::Exp(0.0f) == 1.0f);
  CHECK(sampling::Mass(sampling::Prob(3.5f, 3.5f, 0.7f)) == (uint64_t{1} << 34));
  CHECK(sampling::Exp(-80.5f) == 0.0f);
  double worst = 0.0;
  for (float x = -79.0f; x <= 0.0f; x += 0.00731f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(sampling::Exp(x) - want) / want);
  }
  CHECK(worst < 4e-7);
  // Order-preserving keys; -0 and +0 are one key.
  CHECK(sampling::Key(-0.0f) == sampling::Key(0.0f));
  const std::vector<float> xs = {-1e30f, -2.0f, -1e-30f, 0.0f, 1e-30f, 1.5f, 2.0f, 1e30f};
  for (size_t i = 1; i < xs.size(); ++i) CHECK(sampling::Key(xs[i - 1]) < sampling::Key(xs[i]));
  for (float x : xs) CHECK(sampling::KeyValue(sampling::Key(x)) == x);
  CHECK(sampling::TopPTarget(0.5f, 7) == 4);
  CHECK(sampling::TopPTarget(1.0f, 7) == 7);
  CHECK(sampling::DrawThreshold(0.0, 7) == 0);
  CHECK(sampling::DrawThreshold(0.999999, 7) == 6);
}

std::map<int32_t, int32_t> AsMap(const std::vector<PenaltyEntry>& entries) {
  std::map<int32_t, int32_t> m;
  for (const PenaltyEntry& e : entries) {
    CHECK(m.count(e.token) == 0);  // each token once
    m[e.token] = e.generated_count;
  }
  return m;
}

TEST_CASE("Sampler device job lists each seen token once with its generated count", "[sampler]") {
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.2f;
  Sampler s(p);
  std::vector<int32_t> prompt = {5, 3, 5};
  std::vector<int32_t> generated = {3, 7, 7};
  std::vector<PenaltyEntry> list;
  const SamplingJob job = s.DeviceJob(prompt, generated, &list);
  CHECK(job.repetition_penalty == 1.3f);
  CHECK(job.frequency_penalty == 0.2f);
  CHECK(AsMap(list) == std::map<int32_t, int32_t>{{3, 1}, {5, 0}, {7, 2}});
  // The list follows the request as it grows.
  generated.push_back(9);
  generated.push_back(5);
  list.clear();
  s.DeviceJob(prompt, generated, &list);
  CHECK(AsMap(list) == std::map<int32_t, int32_t>{{3, 1}, {5, 1}, {7, 2}, {9, 1}});

  // Without a repetition penalty prompt tokens do nothing and are left out.
  SamplingParams q;
  q.presence_penalty = 0.5f;
  Sampler s2(q);
  list.clear();
  s2.DeviceJob(prompt, generated, &list);
  CHECK(AsMap(list) == std::map<int32_t, int32_t>{{3, 1}, {5, 1}, {7, 2}, {9, 1}});
  prompt.push_back(11);
  list.clear();
  s2.DeviceJob(prompt, generated, &list);
  CHECK(AsMap(list).count(11) == 0);

  // No penalties: an empty list.
  Sampler plain{SamplingParams{}};
  list.clear();
  plain.DeviceJob(prompt, generated, &list);
  CHECK(list.empty());
}

TEST_CASE("Sampler device job takes the same draw as Sample", "[sampler]") {
  // Two samplers on one seed: one samples on the host, the other hands out jobs that are then
  // sampled with SampleWithJob (what the device computes). Same tokens, step after step.
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (int variant = 0; variant < 6; ++variant) {
    SamplingParams p;
    p.seed = 100 + variant;
    // Variants 4 and 5 add a logit_bias: on tokens the penalties also touch (prompt 2, often
    // generated ones) and on others; variant 5 without penalties (bias-only entries).
    if (variant >= 4) p.logit_bias = {{2, 1.5f}, {7, 3.0f}, {123, -2.5f}, {499, 4.0f}};
    p.temperature = variant == 3 ? 0.0f : 0.8f;
    p.top_k = variant == 1 ? 40 : 0;
    p.top_p = variant == 2 ? 0.9f : 1.0f;
    p.min_p = variant == 1 ? 0.02f : 0.0f;
    if (variant != 5) {
      p.repetition_penalty = 1.2f;
      p.presence_penalty = 0.3f;
      p.frequency_penalty = 0.1f;
    }
    Sampler host(p), device(p);
    const std::vector<int32_t> prompt = {1, 2, 3, 40, 41};
    std::vector<int32_t> generated;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> logits(500);
      for (float& x : logits) x = nd(rng);
      std::vector<float> a = logits, b = logits;
      const int32_t t_host = host.Sample(a, prompt, generated).token;
      std::vector<PenaltyEntry> list;
      const SamplingJob job = device.DeviceJob(prompt, generated, &list);
      if (p.greedy()) CHECK(job.u == 0.0);
      const int32_t t_dev = SampleWithJob(b, job, list).token;
      INFO("variant " << variant << " step " << step);
      REQUIRE(t_host == t_dev);
      CHECK(a == b);  // the same penalized logits
      generated.push_back(t_host);
    }
  }
}

}  // namespace
}  // namespace llm
