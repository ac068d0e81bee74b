// Token sampling for one sequence: penalties, temperature, top-k, top-p, min-p, seeded draw.
// Each request owns its random stream, so the same seed and prompt give the same tokens whatever
// else is in the batch.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

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
  Sampler(const SamplingParams& params);

  // logits: [vocab]; modified in place. `history` holds prompt + generated ids, for penalties;
  // `generated` holds only the generated ids.
  SampledToken Sample(std::span<float> logits, std::span<const int32_t> prompt,
                      std::span<const int32_t> generated);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;  // scratch
  std::vector<float> probs_;    // scratch
};

// log-softmax of logits at `token`, and the top-n entries.
void ComputeLogprobs(std::span<const float> logits, int32_t token, int n, SampledToken* out);

}  // namespace llm
