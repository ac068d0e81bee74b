#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace llm {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Argmax(std::span<const float> x) {
  // std::max_element's answer (lowest index on ties; a NaN at index 0 wins, other NaNs are
  // skipped), but its compare-and-move chain runs at one element per ~4 cycles; eight
  // independent running maxima vectorize (maxps keeps the old value on NaN, as `>` does), then
  // one scan finds the first index holding the maximum.
  const size_t n = x.size();
  if (n == 0 || std::isnan(x[0])) return 0;
  constexpr size_t kLanes = 8;
  float m[kLanes];
  std::fill(m, m + kLanes, x[0]);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
  }
  for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
  float best = m[0];
  for (size_t k = 1; k < kLanes; ++k) best = m[k] > best ? m[k] : best;
  for (i = 0; i < n; ++i) {
    if (x[i] == best) return static_cast<int32_t>(i);
  }
  return 0;
}

void ComputeLogprobs(std::span<const float> logits, int32_t token, int n, SampledToken* out) {
  const float max = logits[Argmax(logits)];
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

KeptDistribution SamplingDistribution(std::span<float> logits, const SamplingJob& job,
                                      std::span<const PenaltyEntry> penalties) {
  const int vocab = static_cast<int>(logits.size());
  for (const PenaltyEntry& e : penalties) {
    if (e.token >= 0 && e.token < vocab)
      logits[e.token] = sampling::ApplyEntry(logits[e.token], e, job);
  }
  KeptDistribution out;
  const int32_t argmax = Argmax(logits);
  if (job.temperature == 0.0f) {
    out.ids = {argmax};
    out.masses = {1};
    out.total = 1;
    return out;
  }
  const float max = logits[argmax];
  const float inv_t = sampling::InvTemperature(job.temperature);
  auto prob = [&](int32_t i) { return sampling::Prob(logits[i], max, inv_t); };
  const bool top_k = job.top_k > 0 && job.top_k < vocab;
  const bool top_p = job.top_p < 1.0f;
  const bool min_p = job.min_p > 0.0f;
  std::vector<int32_t>& order = out.ids;
  order.resize(vocab);
  std::iota(order.begin(), order.end(), 0);
  if (top_k || top_p || min_p) {
    // K is defined on the order "logit descending, lower id first".
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    int keep = top_k ? job.top_k : vocab;
    if (keep < vocab) {
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
    } else {
      std::sort(order.begin(), order.end(), by_logit);
    }
    if (top_p) {
      uint64_t total = 0;
      for (int i = 0; i < keep; ++i) total += sampling::Mass(prob(order[i]));
      const uint64_t target = sampling::TopPTarget(job.top_p, total);
      uint64_t cum = 0;
      int n = 0;
      while (n < keep) {
        cum += sampling::Mass(prob(order[n++]));
        if (cum >= target) break;
      }
      keep = n;
    }
    order.resize(keep);
    if (min_p) {
      // A filter, not a prefix: p falls along the order only up to rounding. The top has p = 1.
      std::erase_if(order, [&](int32_t i) { return prob(i) < job.min_p; });
    }
    std::sort(order.begin(), order.end());
  }
  out.masses.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    out.masses[i] = sampling::Mass(prob(order[i]));
    out.total += out.masses[i];
  }
  return out;
}

SampledToken SampleWithJob(std::span<float> logits, const SamplingJob& job,
                           std::span<const PenaltyEntry> penalties) {
  const KeptDistribution d = SamplingDistribution(logits, job, penalties);
  SampledToken out;
  out.token = d.ids[0];
  if (job.temperature == 0.0f) return out;
  // The draw over kept ids in ascending order.
  const uint64_t threshold = sampling::DrawThreshold(job.u, d.total);
  uint64_t cum = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    cum += d.masses[i];
    if (cum > threshold) {
      out.token = d.ids[i];
      return out;
    }
  }
  out.token = Argmax(logits);  // unreachable: threshold < total
  return out;
}

void Sampler::UpdatePenalties(std::span<const int32_t> prompt, std::span<const int32_t> generated) {
  const bool repetition = params_.repetition_penalty != 1.0f;
  const bool counts = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (!repetition && !counts) return;
  if (prompt.size() < prompt_seen_ || generated.size() < generated_seen_) {
    // Not the same growing request: start over.
    penalties_.clear();
    index_.clear();
    prompt_seen_ = generated_seen_ = 0;
  }
  auto entry = [&](int32_t t) -> PenaltyEntry& {
    auto [it, inserted] = index_.emplace(t, static_cast<int32_t>(penalties_.size()));
    if (inserted) penalties_.push_back({t, 0});
    return penalties_[it->second];
  };
  // Prompt tokens matter only to the repetition penalty.
  if (repetition) {
    for (size_t i = prompt_seen_; i < prompt.size(); ++i) entry(prompt[i]);
  }
  prompt_seen_ = prompt.size();
  for (size_t i = generated_seen_; i < generated.size(); ++i) ++entry(generated[i]).generated_count;
  generated_seen_ = generated.size();
}

SamplingJob Sampler::NextJob() {
  SamplingJob job;
  job.temperature = params_.temperature;
  job.top_k = params_.top_k;
  job.top_p = params_.top_p;
  job.min_p = params_.min_p;
  job.repetition_penalty = params_.repetition_penalty;
  job.presence_penalty = params_.presence_penalty;
  job.frequency_penalty = params_.frequency_penalty;
  // 53-bit uniform from the request's own stream; greedy draws nothing.
  if (!params_.greedy()) job.u = NextUniform();
  return job;
}

double Sampler::NextUniform() {
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
}

SamplingJob Sampler::DeviceJob(std::span<const int32_t> prompt, std::span<const int32_t> generated,
                               std::vector<PenaltyEntry>* penalties) {
  UpdatePenalties(prompt, generated);
  const size_t base = penalties->size();
  penalties->insert(penalties->end(), penalties_.begin(), penalties_.end());
  // logit_bias rides on the token's entry, or on an entry of its own (not seen: no penalties).
  for (const auto& [token, bias] : params_.logit_bias) {
    const auto it = index_.find(token);
    if (it != index_.end()) {
      (*penalties)[base + it->second].bias = bias;
    } else {
      penalties->push_back({token, -1, bias});
    }
  }
  return NextJob();
}

void ApplyLogitBias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  for (const auto& [token, b] : bias) {
    if (token >= 0 && token < vocab) logits[token] += b;
  }
}

SampledToken Sampler::Sample(std::span<float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> generated) {
  ApplyLogitBias(logits, params_.logit_bias);
  UpdatePenalties(prompt, generated);
  SampledToken out = SampleWithJob(logits, NextJob(), penalties_);
  // Logprobs cost a pass of exp() over the vocabulary: only when asked for. SampleWithJob leaves
  // the penalized logits, before temperature, in place.
  if (params_.logprobs > 0) ComputeLogprobs(logits, out.token, params_.logprobs, &out);
  return out;
}

bool HasPenalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

void CountGenerated(std::vector<PenaltyEntry>* entries, int32_t token) {
  for (PenaltyEntry& e : *entries) {
    if (e.token != token) continue;
    e.generated_count = e.generated_count < 0 ? 1 : e.generated_count + 1;
    return;
  }
  entries->push_back({token, 1, 0.0f});
}

}  // namespace llm
