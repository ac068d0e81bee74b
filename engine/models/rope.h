// Rotary-embedding frequencies of the Llama family, with linear and llama3 scaling applied.
// One definition shared by the CPU oracle and the GPU model so their angles agree exactly.
#pragma once

#include <vector>

#include "engine/model_config.h"

namespace llm {

// inv_freq[i] for i in [0, head_dim / 2): 1 / theta^(2i / head_dim), then rope_scaling.
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace llm
