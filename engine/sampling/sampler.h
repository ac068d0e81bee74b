// Token sampling for one sequence: penalties, temperature, top-k, top-p, min-p, seeded draw.
// Each request owns its random stream, so the same seed and prompt give the same tokens whatever
// else is in the batch, and whether the host or the device samples.
//
// The definition, shared by the CPU sampler here and the device kernel
// (kernels/cuda/sampling/sampling.h holds the arithmetic both use):
//  0. logit_bias: l_t += bias_t, before the penalties, as OpenAI and vLLM apply it (on the
//     device, the bias rides on the row's penalty entries: PenaltyEntry::bias).
//  1. Penalties, on the logits l: for every token in prompt + generated, l /= r if l > 0 else
//     l *= r (repetition r); then for every generated token, l -= presence + frequency * count.
//  2. temperature 0: the token is argmax l (lowest id on ties); nothing is drawn.
//  3. Otherwise draw u in [0, 1) from the request's mt19937_64 stream: (x >> 11) * 2^-53, once.
//  4. p_i = exp((l_i - max l) * (1 / T)) in float (sampling::Exp; p = 1 for the top token), and
//     the mass q_i = floor(p_i * 2^34) as an integer (tokens with p below 2^-34 weigh nothing).
//  5. The kept set K, from the order "logit descending, lower id first on ties":
//     top-k: the first k of that order (k = 0 or k >= vocab: all);
//     top-p (< 1): the shortest prefix of the top-k list whose mass reaches
//       ceil(top_p * mass of the top-k list) (so ties at the cut are kept in ascending id order);
//     min-p (> 0): of those, the tokens with p_i >= min_p (the top token has p = 1).
//  6. The token is the smallest id i in K (ascending id order, not the sorted order) whose
//     cumulative mass over kept ids <= i exceeds floor(u * mass of K).
// All masses are integers, so host and device agree exactly for the same logits and draw; a GPU
// finds K with thresholds instead of a sort.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/sampling/sampling_params.h"
#include "kernels/cuda/sampling/sampling.h"

namespace llm {

struct SampledToken {
  int32_t token = -1;
  // log-softmax of the (penalized) logits before temperature, as vLLM reports; filled only when
  // the request asks for logprobs.
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top-N (token, logprob), if asked
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // logits: [vocab]; penalized in place. `prompt` and `generated` are the request's ids; they
  // only grow by appending between calls (the penalty list is kept incrementally).
  SampledToken Sample(std::span<float> logits, std::span<const int32_t> prompt,
                      std::span<const int32_t> generated);

  // The device-side split of Sample: consumes the same single draw, appends this row's penalty
  // entries to *penalties and returns the job; SampleWithJob(logits, job, entries) gives the
  // token Sample would have given.
  SamplingJob DeviceJob(std::span<const int32_t> prompt, std::span<const int32_t> generated,
                        std::vector<PenaltyEntry>* penalties);

  // A draw in [0, 1) from the request's stream (53 bits), for draws beyond one per token
  // (speculative decoding's acceptance tests).
  double NextUniform();

  const SamplingParams& params() const { return params_; }

 private:
  // Brings penalties_ up to date with prompt + generated.
  void UpdatePenalties(std::span<const int32_t> prompt, std::span<const int32_t> generated);
  SamplingJob NextJob();

  SamplingParams params_;
  std::mt19937_64 rng_;
  // One entry per distinct token seen (prompt tokens only with a repetition penalty), with its
  // generated count; index_ maps token -> entry.
  std::vector<PenaltyEntry> penalties_;
  std::unordered_map<int32_t, int32_t> index_;
  size_t prompt_seen_ = 0, generated_seen_ = 0;
};

// The distribution a job draws from (steps 1-5 of the definition, penalties applied to logits in
// place): the kept ids in ascending order with their integer masses. Temperature 0: the argmax
// alone (mass 1).
struct KeptDistribution {
  std::vector<int32_t> ids;
  std::vector<uint64_t> masses;
  uint64_t total = 0;
};
KeptDistribution SamplingDistribution(std::span<float> logits, const SamplingJob& job,
                                      std::span<const PenaltyEntry> penalties);

// Applies `penalties` to logits (in place) and samples them under `job` by the definition above
// (step 6 over SamplingDistribution). Fills only `token`.
SampledToken SampleWithJob(std::span<float> logits, const SamplingJob& job,
                           std::span<const PenaltyEntry> penalties);

// Whether the request's penalties depend on the tokens generated so far (repetition, presence or
// frequency penalty).
bool HasPenalties(const SamplingParams& params);
// Counts one more generated `token` in a row's penalty entries, as Sampler::DeviceJob would give
// them had the token been appended to the generated ids (speculative decoding: the entries of the
// row after a draft).
void CountGenerated(std::vector<PenaltyEntry>* entries, int32_t token);

// Adds each (token, bias) to logits[token] (tokens outside the vocabulary are skipped: Validate
// refuses them).
void ApplyLogitBias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias);

// Index of the largest logit, lowest index on ties: exactly std::max_element's result.
int32_t Argmax(std::span<const float> logits);

// log-softmax of logits at `token`, and the top-n entries.
void ComputeLogprobs(std::span<const float> logits, int32_t token, int n, SampledToken* out);

}  // namespace llm
