#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace llm {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void ComputeLogprobs(std::span<const float> logits, int32_t token, int n, SampledToken* out) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  out->logprob = logits[token] - log_z;
  out->top.clear();
  if (n <= 0) return;
  n = std::min<int>(n, static_cast<int>(logits.size()));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int i = 0; i < n; ++i) out->top.emplace_back(idx[i], logits[idx[i]] - log_z);
}

SampledToken Sampler::Sample(std::span<float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> generated) {
  const int vocab = static_cast<int>(logits.size());
  // Penalties act on the logits before anything else (vLLM/HF order).
  if (params_.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    for (int32_t t : prompt) seen[t] = true;
    for (int32_t t : generated) seen[t] = true;
    for (int i = 0; i < vocab; ++i) {
      if (!seen[i]) continue;
      logits[i] = logits[i] > 0 ? logits[i] / params_.repetition_penalty
                                : logits[i] * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : generated) ++counts[t];
    for (const auto& [t, c] : counts) {
      logits[t] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(c);
    }
  }

  SampledToken out;
  if (params_.greedy()) {
    out.token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    // Logprobs cost a pass of exp() over the vocabulary: only when asked for.
    if (params_.logprobs > 0) ComputeLogprobs(logits, out.token, params_.logprobs, &out);
    return out;
  }
  if (params_.top_k == 0 && params_.top_p >= 1.0f && params_.min_p == 0.0f) {
    // Plain temperature sampling needs no sorted candidate list: one pass over the vocabulary.
    const float max = *std::max_element(logits.begin(), logits.end());
    const double inv_t = 1.0 / params_.temperature;
    probs_.resize(vocab);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i)
      sum += probs_[i] = static_cast<float>(std::exp((logits[i] - max) * inv_t));
    const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * sum;
    double cum = 0.0;
    out.token = vocab - 1;
    for (int i = 0; i < vocab; ++i) {
      cum += probs_[i];
      if (u < cum) {
        out.token = i;
        break;
      }
    }
    if (params_.logprobs > 0) ComputeLogprobs(logits, out.token, params_.logprobs, &out);
    return out;
  }
  // Logprobs are reported from the penalized logits before temperature and truncation.
  std::vector<float> raw;
  if (params_.logprobs > 0) raw.assign(logits.begin(), logits.end());

  // Candidates sorted by logit, descending; ties by id so the order is deterministic.
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  int keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (keep < vocab) {
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }
  // Softmax with temperature over the kept candidates (double for a stable cumulative sum).
  const double inv_t = 1.0 / params_.temperature;
  const float max = logits[order_[0]];
  probs_.resize(keep);
  double sum = 0.0;
  for (int i = 0; i < keep; ++i) {
    probs_[i] = static_cast<float>(std::exp((logits[order_[i]] - max) * inv_t));
    sum += probs_[i];
  }
  // top-p: smallest prefix whose mass reaches top_p (always at least one token).
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    int n = 0;
    while (n < keep) {
      cum += probs_[n] / sum;
      ++n;
      if (cum >= params_.top_p) break;
    }
    keep = n;
  }
  // min-p: drop tokens whose probability is below min_p x the top probability.
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * probs_[0];
    int n = 1;
    while (n < keep && probs_[n] >= threshold) ++n;
    keep = n;
  }
  double kept_sum = 0.0;
  for (int i = 0; i < keep; ++i) kept_sum += probs_[i];
  // 53-bit uniform from the request's own stream.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * kept_sum;
  double cum = 0.0;
  int chosen = keep - 1;
  for (int i = 0; i < keep; ++i) {
    cum += probs_[i];
    if (u < cum) {
      chosen = i;
      break;
    }
  }
  out.token = order_[chosen];
  if (params_.logprobs > 0) ComputeLogprobs(raw, out.token, params_.logprobs, &out);
  return out;
}

}  // namespace llm
