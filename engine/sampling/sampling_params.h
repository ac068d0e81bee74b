// Per-request generation parameters, already validated and with defaults applied.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace llm {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0 = off
  float min_p = 0.0f;
  uint64_t seed = 0;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int logprobs = 0;  // top-N
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the raw logits before anything
  // else. Rows with a bias are sampled on the host (EngineCore's device job declines them).
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool greedy() const { return temperature == 0.0f; }
};

struct StoppingParams {
  int max_tokens = 256;
  int min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

}  // namespace llm
