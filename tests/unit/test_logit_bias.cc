// Tests for logit_bias on the host sampler: +100 forces a token, -100 bans one, over random
// logits, seeds, temperatures and truncations; the bias is added before the penalties.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "engine/sampling/sampler.h"

namespace llm {
namespace {

std::vector<float> RandomLogits(std::mt19937& rng, int vocab, float spread) {
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> l(vocab);
  for (float& x : l) x = d(rng);
  return l;
}

TEST_CASE("logit_bias +100 forces a token and -100 bans one", "[logit_bias]") {
  std::mt19937 rng(1234);
  const float temperatures[] = {0.0f, 0.7f, 1.0f, 1.5f};
  for (int trial = 0; trial < 200; ++trial) {
    const int vocab = 2 + static_cast<int>(rng() % 300);
    std::vector<float> logits = RandomLogits(rng, vocab, 3.0f);
    const int32_t target = static_cast<int32_t>(rng() % vocab);
    SamplingParams p;
    p.temperature = temperatures[trial % 4];
    p.top_k = trial % 3 == 0 ? 5 : 0;
    p.top_p = trial % 5 == 0 ? 0.9f : 1.0f;
    p.seed = rng();
    INFO("trial " << trial << " vocab " << vocab << " target " << target);

    p.logit_bias = {{target, 100.0f}};
    Sampler force(p);
    std::vector<float> l = logits;
    CHECK(force.Sample(l, {}, {}).token == target);

    // Banning the argmax, then every token but one, never yields a banned token.
    const int32_t top = Argmax(logits);
    p.logit_bias = {{top, -100.0f}};
    for (int draw = 0; draw < 5; ++draw) {
      Sampler ban(p);
      p.seed += 1;
      l = logits;
      CHECK(ban.Sample(l, {}, {}).token != top);
    }
    p.logit_bias.clear();
    for (int32_t t = 0; t < vocab; ++t) {
      if (t != target) p.logit_bias.emplace_back(t, -100.0f);
    }
    Sampler only(p);
    l = logits;
    CHECK(only.Sample(l, {}, {}).token == target);
  }
}

TEST_CASE("logit_bias comes before the penalties and shows in the logprobs", "[logit_bias]") {
  // Token 1 is in the prompt, so the repetition penalty (2) divides its positive logit.
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  p.logprobs = 1;
  p.logit_bias = {{1, 3.0f}};
  std::vector<float> l = {3.0f, 2.0f, 0.0f};
  const int32_t prompt[] = {1};
  Sampler s(p);
  const SampledToken t = s.Sample(l, prompt, {});
  // Bias first: (2 + 3) / 2 = 2.5 < 3. Penalty first: 2 / 2 + 3 = 4 > 3 would pick token 1.
  CHECK(t.token == 0);
  CHECK(l[1] == Approx(2.5f));
  CHECK(t.top.size() == 1);
}

}  // namespace
}  // namespace llm
