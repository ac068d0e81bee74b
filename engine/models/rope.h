// Rotary-embedding frequencies with linear, llama3 and yarn scaling applied. One definition
// shared by the CPU oracle, the GPU models and the DeepSeek (MLA) models so their angles agree.
#pragma once

#include <vector>

#include "engine/model_config.h"

namespace llm {

// inv_freq[i] for i in [0, head_dim / 2): 1 / theta^(2i / head_dim), then rope_scaling.
std::vector<float> RopeInvFreq(const ModelConfig& config);

struct YarnFreqParams {
  int dim = 0;  // rotated dimensions
  double base = 10000.0;
  double factor = 1.0;
  int original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
};

// YaRN's inverse frequencies ([dim / 2]): HF's _compute_yarn_parameters (and DeepSeek's
// yarn_find_correction_range / yarn_linear_ramp_mask, which agree with truncate = true).
std::vector<float> YarnInvFreq(const YarnFreqParams& p);

}  // namespace llm
